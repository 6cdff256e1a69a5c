package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/render"
)

// formatFlag adds -o/--format with the allowed values, the first being the
// default, and checks the value before the command runs.
func formatFlag(cmd *cobra.Command, allowed ...string) *string {
	v := new(string)
	cmd.Flags().StringVarP(v, "format", "o", allowed[0], fmt.Sprintf("output format: %v", allowed))
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if !slices.Contains(allowed, *v) {
			return fmt.Errorf("--format %q: want one of %v", *v, allowed)
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
	_ = cmd.RegisterFlagCompletionFunc("format", cobra.FixedCompletions(allowed, cobra.ShellCompDirectiveNoFileComp))
	return v
}

func repoFlag(cmd *cobra.Command) *string {
	v := new(string)
	cmd.Flags().StringVar(v, "repo", ".", "the cluster repository's directory")
	_ = cmd.MarkFlagDirname("repo")
	return v
}

// loadRepo renders the repository in dir. An invalid repository returns the
// partial model and an *render.InvalidError; an I/O failure returns a plain
// error.
func loadRepo(dir string) (*render.Model, error) {
	fsys, err := repoFS(dir)
	if err != nil {
		return nil, err
	}
	defer fsys.Close()
	return render.Render(fsys)
}

// printDiagnostics writes every diagnostic of m (errors first, then
// warnings), one a line.
func printDiagnostics(w io.Writer, ds render.Diagnostics) {
	for _, d := range ds.Errors() {
		fmt.Fprintln(w, d.Format())
	}
	for _, d := range ds.Warnings() {
		fmt.Fprintln(w, d.Format())
	}
}

// jsonDiagnostic is a diagnostic in the documented JSON output.
type jsonDiagnostic struct {
	File    string `json:"file"`
	Line    int    `json:"line"`
	Column  int    `json:"column"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
	Text    string `json:"text"`
}

func toJSON(ds render.Diagnostics) []jsonDiagnostic {
	out := []jsonDiagnostic{}
	for _, d := range ds {
		out = append(out, jsonDiagnostic{File: d.Pos.File, Line: d.Pos.Line, Column: d.Pos.Column, Field: d.Field, Message: d.Message, Text: d.String()})
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isInvalid reports whether err says the repository is invalid.
func isInvalid(err error) bool {
	var ie *render.InvalidError
	return errors.As(err, &ie)
}
