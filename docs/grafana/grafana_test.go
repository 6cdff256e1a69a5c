package grafana

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
)

// The checked-in keel.json is what the generator writes: edit
// dashboard.go and run `make grafana`, never the JSON.
func TestDashboardUpToDate(t *testing.T) {
	want, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("keel.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("docs/grafana/keel.json differs from what docs/grafana/dashboard.go builds: run `make grafana`")
	}
}

// Every expression of the dashboard and of the alert rules parses as
// PromQL and names its metrics; TestDashboardMetricsExist (agent package)
// checks those against a running agent's /metrics.
func TestExpressionsParse(t *testing.T) {
	dash, err := os.ReadFile("keel.json")
	if err != nil {
		t.Fatal(err)
	}
	exprs, vars, err := DashboardExprs(dash)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"datasource", "job", "node"}; !slices.Equal(vars, want) {
		t.Errorf("variables %v, want %v", vars, want)
	}
	rules, err := os.ReadFile("alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := AlertExprs(rules)
	if err != nil {
		t.Fatal(err)
	}
	if len(exprs) < 40 || len(alerts) < 15 {
		t.Fatalf("found %d dashboard and %d alert expressions; the readers miss some", len(exprs), len(alerts))
	}
	for _, e := range append(exprs, alerts...) {
		pe, err := Parse(e.PromQL, vars)
		if err != nil {
			t.Errorf("%s: %q: %v", e.Where, e.PromQL, err)
			continue
		}
		names, err := MetricNames(pe)
		if err != nil || len(names) == 0 {
			t.Errorf("%s: %q: metrics %v, %v", e.Where, e.PromQL, names, err)
		}
	}
}

// The checks catch what they are for.
func TestCheckersRefuse(t *testing.T) {
	vars := []string{"job", "node"}
	for _, tc := range []struct{ name, expr, err string }{
		{"syntax", `sum(rate(keel_sync_errors_total[5m])`, "unclosed"},
		{"unknown variable", `keel_instances{job=~"$cluster"}`, "undefined variables"},
		{"Grafana function", `label_values(keel_node_info, job)`, "unknown function"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Parse(tc.expr, vars); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Parse(%q) = %v, want an error with %q", tc.expr, err, tc.err)
			}
		})
	}
	e, err := Parse(`sum by (node) (rate(keel_sync_errors_total{job=~"$job"}[$__rate_interval]) * on(job, instance) group_left(node) keel_node_info{node=~"${node}"}) + {__name__="up"}`, vars)
	if err != nil {
		t.Fatal(err)
	}
	if names, err := MetricNames(e); err != nil || !slices.Equal(names, []string{"keel_node_info", "keel_sync_errors_total", "up"}) {
		t.Fatalf("MetricNames = %v, %v", names, err)
	}
	e, _ = Parse(`{__name__=~"keel_.+"}`, nil)
	if _, err := MetricNames(e); err == nil {
		t.Fatal("a selector by a __name__ regular expression was accepted")
	}
	if _, err := AlertExprs([]byte("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n        for: 2 minutes\n        annotations: {summary: '{{ $labels.x '}\n")); err == nil ||
		!strings.Contains(err.Error(), "for:") || !strings.Contains(err.Error(), "annotation summary") {
		t.Fatalf("AlertExprs accepted a bad for: and a bad template: %v", err)
	}
}
