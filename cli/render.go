package cli

import (
	"fmt"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"
)

func (e *env) renderCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "render",
		Short: "Print the expanded model: every instance with its defaults, node subnets, VIPs and specHash",
		Long: `Render prints the cluster repository as Keel understands it: the Cluster
settings with defaults, every node with its subnet (and where it came from:
explicit, locked or derived), every Service with its VIP, every instance
(Jails and Service replicas) with its resolved spec and specHash, and the
Ingresses. Where each instance lands is decided by keel plan.

Exit status: 0 success, 1 invalid repository, 2 usage or I/O error.`,
		Example: "  keel render --repo ./cluster\n  keel render -o json | jq '.instances[].name'",
		Args:    cobra.NoArgs,
	}
	repo := repoFlag(cmd)
	format := formatFlag(cmd, "yaml", "json")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		m, err := loadRepo(*repo)
		if isInvalid(err) {
			printDiagnostics(e.stderr, m.Diagnostics)
			return invalid(fmt.Errorf("%s is invalid", *repo))
		}
		if err != nil {
			return err
		}
		if *format == "json" {
			return writeJSON(e.stdout, m)
		}
		enc := yaml.NewEncoder(e.stdout)
		enc.SetIndent(2)
		if err := enc.Encode(m); err != nil {
			return err
		}
		return enc.Close()
	}
	return cmd
}
