package cli

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	gosync "sync"
	"time"

	"github.com/spf13/cobra"
)

// demoLoadCommand sends a steady load of GET requests to a URL (the demo's
// web VIP) for a while, as a browser or an API client would (keep-alive
// connections), and says how many failed: the demo runs it while a push
// rolls the web Service out, to show that no request fails. It exits 1
// when any did.
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
		url := args[0]
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: *clients}}
		defer client.CloseIdleConnections()
		var (
			mu        gosync.Mutex
			latencies []time.Duration
			failed    int
			errs      = map[string]int{}
			answers   = map[string]int{}
			wg        gosync.WaitGroup
		)
		every := time.Duration(*clients) * time.Second / time.Duration(*rate)
		end := time.Now().Add(*duration)
		for i := range *clients {
			wg.Go(func() {
				next := time.Now().Add(time.Duration(i) * every / time.Duration(*clients))
				for {
					if d := time.Until(next); d > 0 {
						select {
						case <-e.ctx.Done():
							return
						case <-time.After(d):
						}
					}
					if time.Now().After(end) {
						return
					}
					next = next.Add(every)
					start := time.Now()
					answer, err := demoGet(client, url)
					took := time.Since(start)
					mu.Lock()
					latencies = append(latencies, took)
					if err != nil {
						failed++
						errs[err.Error()]++
					} else {
						answers[answer]++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		slices.Sort(latencies)
		pct := func(p float64) time.Duration {
			if len(latencies) == 0 {
				return 0
			}
			return latencies[min(len(latencies)-1, int(p*float64(len(latencies))))].Round(100 * time.Microsecond)
		}
		var seen []string
		for _, a := range slices.Sorted(maps.Keys(answers)) {
			seen = append(seen, fmt.Sprintf("%q ×%d", a, answers[a]))
		}
		fmt.Fprintf(e.stdout, "demo-load: %d requests in %s, %d failed; latency p50 %s, p99 %s\n  answers: %s\n",
			len(latencies), *duration, failed, pct(0.5), pct(0.99), strings.Join(seen, ", "))
		for _, msg := range slices.Sorted(maps.Keys(errs)) {
			fmt.Fprintf(e.stdout, "  failed ×%d: %s\n", errs[msg], msg)
		}
		if failed > 0 {
			return fmt.Errorf("%d of %d requests failed", failed, len(latencies))
		}
		return nil
	}
	return cmd
}

// demoGet fetches url and returns the answer's first word (the demo
// service's greeting); a status other than 2xx is an error.
func demoGet(client *http.Client, url string) (string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", err
	}
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("status %d", resp.StatusCode)
	}
	word, _, _ := strings.Cut(strings.TrimSpace(string(body)), " ")
	return word, nil
}
