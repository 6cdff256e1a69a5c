//go:build unix

package agent_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/docs/grafana"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/sync"
)

// synthetic are the series Prometheus makes itself at each scrape; no
// exposition has them.
var synthetic = []string{"up"}

// Every metric the Grafana dashboard (docs/grafana/keel.json) and the
// example alert rules (docs/grafana/alerts.yaml) query is in a real
// agent's /metrics, scraped over TCP: an agent with a Service (so that its
// proxy runs), an Ingress with a certificate from Pebble, an instance that
// restarted, a host check and a refused commit, so that every vector has
// its series.
func TestDashboardMetricsExist(t *testing.T) {
	t.Parallel()
	want := queriedMetrics(t)

	c := newIngCluster(t, []ingNode{{name: "n1"}})
	// Service VIPs and pod addresses on loopback, so that the proxy can
	// listen on the Service's VIP (the default serviceCIDR is not local).
	a := 20 + rand.IntN(200)
	writeCommit(t, c.work, "cluster.yaml", fmt.Sprintf("apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\n"+
		"spec: {livenessTTL: 6s, reportInterval: 2s, podCIDR: 127.%d.0.0/16, serviceCIDR: 127.%d.0.0/16}\n", a, a+1), "loopback CIDRs")
	git(t, c.work, "push", "-q", c.bare, "main")

	n := c.nodes[0]
	drv := fake.New()
	reg := prometheus.NewRegistry()
	log := &lockedBuffer{}
	signer, err := sync.LoadReportSigner(n.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ag, err := agent.New(agent.Options{
		Node: n.name, StateDir: t.TempDir(), Remote: sync.Remote{URL: c.bare, Branch: "main"}, Driver: drv,
		Version: "0.1.0", Registry: reg, Poll: 200 * time.Millisecond, Reconcile: 200 * time.Millisecond, DisableWatch: true,
		Logger: slog.New(slog.NewTextHandler(log, nil)), ReportSigner: signer,
		Ingress: &agent.IngressOptions{
			HTTPAddr: net.JoinHostPort(n.ip, strconv.Itoa(c.httpPort)), HTTPSAddr: net.JoinHostPort(n.ip, strconv.Itoa(c.httpsPort)),
			Directory: c.peb.DirectoryURL, Roots: c.peb.DirectoryRoots, HTTP01Wait: time.Second,
			RetryBase: time.Second, RetryMax: 2 * time.Second,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", log.String())
		}
	}()
	srv := httptest.NewServer(ag.Handler())
	defer srv.Close()

	c.waitServed(n) // the certificate's expiry and its order
	// A request on the ingress's HTTP listener (answered 308).
	req, err := http.NewRequest(http.MethodGet, "http://"+net.JoinHostPort(n.ip, strconv.Itoa(c.httpPort))+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = ingHost
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// A restart: the instance crashes and the agent starts it again.
	waitFor(t, "the Service's instance", func() bool { return len(drv.Instances()) == 1 })
	if err := drv.Crash(drv.Instances()[0], 1); err != nil {
		t.Fatal(err)
	}
	// A refused commit last: the agent keeps the applied one.
	writeCommit(t, c.work, "apps/bad.yaml", "apiVersion: keel/v1\nkind: Jail\nmetadata: {name: bad}\nspec: {imgae: base/x}\n", "a typo")
	git(t, c.work, "push", "-q", c.bare, "main")

	var missing []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		exposed := scrape(t, srv.URL+"/metrics")
		missing = missing[:0]
		for _, name := range want {
			if !exposed[name] && !slices.Contains(synthetic, name) {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dashboard or the alerts query metrics the agent does not expose: %v", missing)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%d metrics queried, all exposed", len(want))
}

// queriedMetrics are the metric names the dashboard and the alert rules
// query.
func queriedMetrics(t *testing.T) []string {
	t.Helper()
	dash, err := os.ReadFile("../docs/grafana/keel.json")
	if err != nil {
		t.Fatal(err)
	}
	exprs, vars, err := grafana.DashboardExprs(dash)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile("../docs/grafana/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	alerts, err := grafana.AlertExprs(rules)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range append(exprs, alerts...) {
		pe, err := grafana.Parse(e.PromQL, vars)
		if err != nil {
			t.Fatalf("%s: %v", e.Where, err)
		}
		ns, err := grafana.MetricNames(pe)
		if err != nil {
			t.Fatalf("%s: %v", e.Where, err)
		}
		names = append(names, ns...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// scrape reads the sample names of a text exposition: a histogram's
// appear with their _bucket, _sum and _count suffixes, as PromQL sees them.
func scrape(t *testing.T, url string) map[string]bool {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// writeCommit writes one file of the work tree and commits it.
func writeCommit(t *testing.T, work, name, content, msg string) {
	t.Helper()
	p := filepath.Join(work, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, work, "add", "-A")
	git(t, work, "commit", "-q", "-m", msg)
}
