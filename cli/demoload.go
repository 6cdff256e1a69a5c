package cli

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/keel-dev/keel/internal/loadgen"
)

// demoLoadCommand sends a steady load of GET requests to a URL (the demo's
// web VIP) for a while, as a browser or an API client would (keep-alive
// connections), and says how many failed: the demo runs it while a push
// rolls the web Service out, to show that no request fails. It exits 2
// when any did. A request fails when it errs, takes over 5 s, or is
// answered with anything but demo-web's greeting (internal/loadgen).
// The bounds of demo-load's flags: at most 1.2 million requests, about
// 180 MB of outcomes at the most.
const (
	maxDemoLoadDuration = 10 * time.Minute
	maxDemoLoadRate     = 2000
	maxDemoLoadClients  = 256
)

func (e *env) demoLoadCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "demo-load URL",
		Short:  "Send a steady load to a URL and count the requests that fail (the demo's load loop)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
	}
	duration := cmd.Flags().Duration("duration", 10*time.Second, "how long to send requests")
	rate := cmd.Flags().Int("rate", 200, "requests per second, all clients together")
	clients := cmd.Flags().Int("clients", 8, "concurrent clients, each on keep-alive connections")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if *rate < 1 || *clients < 1 || *duration <= 0 {
			return errors.New("--rate, --clients and --duration must be positive")
		}
		// Every request's outcome is kept for the summary (about 150 bytes
		// each): bound what a run can hold.
		if *duration > maxDemoLoadDuration || *rate > maxDemoLoadRate || *clients > maxDemoLoadClients {
			return fmt.Errorf("--duration is at most %s, --rate %d and --clients %d (a demo's load loop)", maxDemoLoadDuration, maxDemoLoadRate, maxDemoLoadClients)
		}
		l, err := loadgen.Start(loadgen.Options{URL: args[0], Rate: float64(*rate), KeepAlive: *clients, Timeout: 5 * time.Second})
		if err != nil {
			return err
		}
		t := time.NewTimer(*duration)
		select {
		case <-e.ctx.Done():
		case <-t.C:
		}
		t.Stop()
		res := l.Stop()
		st := res.Stats(nil)
		var seen []string
		for _, g := range slices.Sorted(maps.Keys(st.Greetings)) {
			seen = append(seen, fmt.Sprintf("%q ×%d", g, st.Greetings[g]))
		}
		fmt.Fprintf(e.stdout, "demo-load: %d requests in %s, %d failed; latency p50 %s, p99 %s\n  answers: %s\n",
			st.Sent, res.Duration.Round(100*time.Millisecond), st.Failed, st.P50.Round(100*time.Microsecond), st.P99.Round(100*time.Microsecond), strings.Join(seen, ", "))
		for _, msg := range st.Errors {
			fmt.Fprintf(e.stdout, "  failed %s\n", msg)
		}
		if st.Failed > 0 {
			return fmt.Errorf("%d of %d requests failed", st.Failed, st.Sent)
		}
		return nil
	}
	return cmd
}
