package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/render"
)

func (e *env) validateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Check a cluster repository and report every error with its position",
		Long: `Validate reads every spec of the cluster repository strictly and reports
all errors at once, each as file:line:col: field.path: message, then the
warnings. Warnings (such as allocations not yet pinned in keel.lock) do not
fail it. A directory without cluster.yaml at its root is not a cluster
repository: validate reads nothing else there and reports that one error.

Exit status: 0 valid, 1 invalid, 2 usage or I/O error.`,
		Example: "  keel validate --repo ./cluster\n  keel validate -o json",
		Args:    cobra.NoArgs,
	}
	repo := repoFlag(cmd)
	format := formatFlag(cmd, "text", "json")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		m, err := loadRepo(*repo)
		if err != nil && !isInvalid(err) {
			return err
		}
		ds := m.Diagnostics
		errs, warns := ds.Errors(), ds.Warnings()
		switch *format {
		case "json":
			out := struct {
				Valid    bool             `json:"valid"`
				Errors   []jsonDiagnostic `json:"errors"`
				Warnings []jsonDiagnostic `json:"warnings"`
				Summary  summary          `json:"summary"`
			}{len(errs) == 0, toJSON(errs), toJSON(warns), summarize(m)}
			if err := writeJSON(e.stdout, out); err != nil {
				return err
			}
		default:
			printDiagnostics(e.stdout, ds)
			if len(errs) > 0 {
				fmt.Fprintf(e.stdout, "%s: invalid: %s, %s\n", *repo, plural(len(errs), "error"), plural(len(warns), "warning"))
			} else {
				s := summarize(m)
				fmt.Fprintf(e.stdout, "%s: valid: %s, %s, %s, %s; %s\n", *repo,
					plural(s.Nodes, "node"), plural(s.Services, "service"), plural(s.Instances, "instance"),
					plural(s.Ingresses, "ingress"), plural(len(warns), "warning"))
			}
		}
		if len(errs) > 0 {
			return invalid(nil)
		}
		return nil
	}
	return cmd
}

type summary struct {
	Nodes     int `json:"nodes"`
	Services  int `json:"services"`
	Instances int `json:"instances"`
	Ingresses int `json:"ingresses"`
}

func summarize(m *render.Model) summary {
	return summary{len(m.Nodes), len(m.Services), len(m.Instances), len(m.Ingresses)}
}

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", word)
	}
	if word == "ingress" {
		return fmt.Sprintf("%d ingresses", n)
	}
	return fmt.Sprintf("%d %ss", n, word)
}
