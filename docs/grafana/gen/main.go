// Command gen writes Keel's Grafana dashboard, docs/grafana/keel.json
// (`make grafana`, or `go generate ./docs/grafana`).
package main

import (
	"fmt"
	"os"

	"github.com/keel-dev/keel/docs/grafana"
)

func main() {
	out := "keel.json"
	if len(os.Args) > 1 {
		out = os.Args[1]
	}
	b, err := grafana.JSON()
	if err == nil {
		err = os.WriteFile(out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
