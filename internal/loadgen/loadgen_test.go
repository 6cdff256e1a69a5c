package loadgen

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"
)

// greeter answers as demo-web does, after the delay a request asks for;
// while broken is set it answers 503.
type greeter struct {
	n      atomic.Int64
	broken atomic.Bool
	mu     gosync.Mutex
	delays []string
}

func (g *greeter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := g.n.Add(1)
	if d := r.URL.Query().Get("delay"); d != "" {
		g.mu.Lock()
		g.delays = append(g.delays, d)
		g.mu.Unlock()
		dur, _ := time.ParseDuration(d)
		time.Sleep(dur)
	}
	if g.broken.Load() {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintf(w, "hello from web-%d on node n1 (request %d)\n", n%2, n)
}

func TestStartRefusesBadOptions(t *testing.T) {
	for _, o := range []Options{
		{URL: "https://127.0.0.1:1/", KeepAlive: 1},
		{URL: "127.0.0.1:1", KeepAlive: 1},
		{URL: "http://127.0.0.1:1/"},
		{URL: "http://127.0.0.1:1/", KeepAlive: 1, Rate: -1},
	} {
		if l, err := Start(o); err == nil {
			l.Stop()
			t.Errorf("Start(%+v): no error", o)
		}
	}
}

// TestLoad: the clients of each kind send at the rate asked, every answer
// is counted by greeting and replica, slow clients ask for their delay,
// and a failure (a 503) is counted on the side of the mark it came.
func TestLoad(t *testing.T) {
	g := &greeter{}
	srv := httptest.NewServer(g)
	defer srv.Close()
	l, err := Start(Options{URL: srv.URL + "/", Rate: 100, KeepAlive: 2, Fresh: 2, Slow: 1, SlowDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for l.SoFar().Sent < 40 {
		time.Sleep(10 * time.Millisecond)
	}
	l.Mark("broken")
	g.broken.Store(true)
	for l.SoFar().Failed < 10 {
		time.Sleep(10 * time.Millisecond)
	}
	res := l.Stop()
	res2 := l.Stop() // a second Stop is harmless
	if len(res2.Samples) != len(res.Samples) {
		t.Errorf("a second Stop saw %d samples, the first %d", len(res2.Samples), len(res.Samples))
	}

	before, after := res.Before("broken"), res.After("broken")
	if before.Sent < 30 {
		t.Errorf("before the mark: %d sent; want at least 30 (slow requests aside)", before.Sent)
	}
	// A request in flight at the mark may get the 503: those answered
	// before it may not.
	at := res.MarkAt("broken")
	if done := res.Stats(func(s Sample) bool { return s.At+s.Latency < at }); done.Failed != 0 {
		t.Errorf("answered before the mark: %d of %d failed: %q", done.Failed, done.Sent, done.Errors)
	}
	if after.Failed == 0 || !strings.Contains(after.Errors[0], "503") {
		t.Errorf("after the mark: %d failed, errors %q; want 503s", after.Failed, after.Errors)
	}
	all := res.Stats(nil)
	if all.Greetings["hello"] != all.Sent-all.Failed || all.Replicas["web-0"]+all.Replicas["web-1"] != all.Sent-all.Failed {
		t.Errorf("answers by greeting %v, by replica %v; want every success counted once in each", all.Greetings, all.Replicas)
	}
	kinds := map[string]int{}
	for _, s := range res.Samples {
		kinds[s.Kind]++
	}
	if kinds["keepAlive"] == 0 || kinds["fresh"] == 0 || kinds["slow"] == 0 {
		t.Errorf("requests by kind %v: want each kind", kinds)
	}
	slow := res.Stats(func(s Sample) bool { return s.Kind == "slow" && s.Err == "" })
	if slow.Sent > 0 && slow.P50 < 50*time.Millisecond {
		t.Errorf("slow requests' p50 %s: want at least their delay, 50ms", slow.P50)
	}
	g.mu.Lock()
	if len(g.delays) == 0 || g.delays[0] != "50ms" {
		t.Errorf("delays asked %v: want 50ms", g.delays)
	}
	g.mu.Unlock()
	if got := res.MarkAt("none"); got != res.Duration {
		t.Errorf("MarkAt of an unknown mark: %s, want the load's end %s", got, res.Duration)
	}
	if s := res.Summary(); !strings.Contains(s, "at ") || !strings.Contains(s, "broken") || !strings.Contains(s, "failed") {
		t.Errorf("summary without the mark or the failures:\n%s", s)
	}
}

// TestNotAGreeting: an answer 200 that is not demo-web's greeting fails.
func TestNotAGreeting(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "<html>default page</html>")
	}))
	defer srv.Close()
	l, err := Start(Options{URL: srv.URL, Rate: 50, KeepAlive: 1})
	if err != nil {
		t.Fatal(err)
	}
	for l.SoFar().Sent < 3 {
		time.Sleep(10 * time.Millisecond)
	}
	st := l.Stop().Stats(nil)
	if st.Failed != st.Sent || !strings.Contains(st.Errors[0], "not a greeting") {
		t.Errorf("%d of %d failed, errors %q: want every one, as not a greeting", st.Failed, st.Sent, st.Errors)
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(d, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 of 1..100 ms: %s", p)
	}
	if p := percentile(d, 0.5); p != 50*time.Millisecond {
		t.Errorf("p50 of 1..100 ms: %s", p)
	}
	if p := percentile(nil, 0.5); p != 0 {
		t.Errorf("p50 of nothing: %s", p)
	}
}
