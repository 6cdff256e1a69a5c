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

// The bounds of demo-load's flags. Every request's outcome is kept for
// the summary (about 150 bytes, and a copy of 90 at the end): at most
// 200,000 requests (17 min at the default rate), some 50 MB.
const (
	maxDemoLoadRequests = 200_000
	maxDemoLoadRate     = 2000
	maxDemoLoadClients  = 256
)

// demoLoadCommand sends a steady load of GET requests to a URL (the demo's
// web VIP) for a while, as a browser or an API client would (keep-alive
// connections), and says how many failed: the demo runs it while a push
// rolls the web Service out, to show that no request fails. It exits 2
// when any did. A request fails when it errs, takes over 5 s, or is
// answered with anything but demo-web's greeting (internal/loadgen).
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
		if *rate > maxDemoLoadRate || *clients > maxDemoLoadClients || float64(*rate)*duration.Seconds() > maxDemoLoadRequests {
			return fmt.Errorf("--rate is at most %d, --clients %d, and --rate × --duration %d requests (a demo's load loop keeps every request's outcome)",
				maxDemoLoadRate, maxDemoLoadClients, maxDemoLoadRequests)
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
