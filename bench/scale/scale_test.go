package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmoke runs the harness for a few seconds with five nodes in each
// mode, with short intervals and some churn, so that it keeps working: no
// fetch or publication may fail, and every mode must fetch and publish.
func TestSmoke(t *testing.T) {
	t.Setenv("GIT_CONFIG_GLOBAL", os.DevNull)
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	for _, mode := range []string{"poll", "gossip"} {
		t.Run(mode, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.nodes, cfg.mode = 5, mode
			cfg.duration, cfg.warmup = 6*time.Second, 2500*time.Millisecond
			cfg.interval, cfg.heartbeat, cfg.safetyPoll = time.Second, 2*time.Second, 2*time.Second
			cfg.churn, cfg.maxDelay = 30, 100*time.Millisecond
			cfg.dir = t.TempDir()
			cfg.table = filepath.Join(t.TempDir(), "table.md")
			var out strings.Builder
			st, err := run(context.Background(), cfg, &out)
			t.Log(out.String())
			if err != nil {
				t.Fatal(err)
			}
			if st.failedFetch+st.failedPub > 0 {
				t.Errorf("%d fetches and %d publications failed: %s", st.failedFetch, st.failedPub, st.firstErr)
			}
			if st.fetches == 0 || st.publishes == 0 {
				t.Errorf("%d fetches and %d publications in the steady state", st.fetches, st.publishes)
			}
			row, err := os.ReadFile(cfg.table)
			if err != nil || !strings.HasPrefix(string(row), "| 5 | "+mode) {
				t.Errorf("table row %q, %v", row, err)
			}
		})
	}
}
