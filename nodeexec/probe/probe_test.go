package probe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-dev/keel/render"
)

// A target without checks (a Jail without any) is ready as soon as Set
// sees it.
func TestNoChecksReadyAtOnce(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	p := newProber(t, Options{Now: func() time.Time { return at }})
	if err := p.Set([]Target{{Name: "job", Identity: "1"}}); err != nil {
		t.Fatal(err)
	}
	s, ok := p.Status("job")
	if !ok || s != (Status{Ready: true, ReadySince: at, StartupPassed: true}) {
		t.Errorf("Status = %+v, %v", s, ok)
	}
	select {
	case <-p.Changes():
	default:
		t.Errorf("no change signalled")
	}
	if _, ok := p.Status("other"); ok {
		t.Errorf("Status of a name never set")
	}
}

func TestTCP(t *testing.T) {
	p := newProber(t, Options{})
	_, up := listen(t)
	down := closedPort(t)
	err := p.Set([]Target{
		{Name: "up", Address: loopback, Identity: "1", Checks: render.Checks{Readiness: tcpCheck(up)}},
		{Name: "down", Address: loopback, Identity: "1", Checks: render.Checks{Readiness: tcpCheck(down)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := waitFor(t, p, "up", "ready", isReady)
	if s.Failure != "" || !s.StartupPassed || s.ReadySince.IsZero() {
		t.Errorf("up: %+v", s)
	}
	want := fmt.Sprintf("readiness: tcp port %d: connection refused", down)
	s = waitFor(t, p, "down", "it fails", func(s Status) bool { return s.Failure != "" })
	if s.Ready || s.Failure != want {
		t.Errorf("down: %+v; want not ready, failure %q", s, want)
	}
}

func TestHTTP(t *testing.T) {
	var lastHost atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lastHost.Store(r.Host)
		switch r.URL.Path {
		case "/ok":
			io.WriteString(w, "fine")
		case "/fail":
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "secret-token-in-the-body")
		case "/moved":
			http.Redirect(w, r, "/fail", http.StatusFound)
		case "/host":
			if r.Host != "app.example.com" {
				w.WriteHeader(http.StatusMisdirectedRequest)
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	check := func(path, host string, lo, hi int) *render.Check {
		return &render.Check{HTTP: &render.HTTPCheck{Port: port, Path: path, Host: host, StatusMin: lo, StatusMax: hi},
			Period: render.Duration(50 * time.Millisecond)}
	}
	tests := []struct {
		name    string
		check   *render.Check
		failure string // "" for a check that passes
	}{
		{"a 200", check("/ok", "", 0, 0), ""},
		{"the default path", check("", "", 200, 299), "readiness: http GET /: status 404"},
		{"a 503, and never its body", check("/fail", "", 200, 399), "readiness: http GET /fail: status 503"},
		{"a redirect is not followed", check("/moved", "", 200, 399), ""},
		{"a redirect outside the range", check("/moved", "", 200, 299), "readiness: http GET /moved: status 302"},
		{"the expected status", check("/fail", "", 503, 503), ""},
		{"the host header", check("/host", "app.example.com", 200, 200), ""},
		{"a wrong host header", check("/host", "other.example.com", 200, 200), "readiness: http GET /host: status 421"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProber(t, Options{})
			if err := p.Set([]Target{{Name: "web", Address: loopback, Identity: "1", Checks: render.Checks{Readiness: tt.check}}}); err != nil {
				t.Fatal(err)
			}
			if tt.failure == "" {
				waitFor(t, p, "web", "ready", isReady)
				return
			}
			s := waitFor(t, p, "web", "it fails", func(s Status) bool { return s.Failure != "" })
			if s.Ready || s.Failure != tt.failure {
				t.Errorf("%+v; want not ready, failure %q", s, tt.failure)
			}
		})
	}
	if h, _ := lastHost.Load().(string); h == "" {
		t.Errorf("the server saw no request")
	}
}

func TestExec(t *testing.T) {
	e := newExecer()
	e.exit("ok", 0, "fine")
	e.exit("/usr/bin/pg_isready", 3, "\n  db down: no connection\nsecond line\n")
	e.exit("silent", 1, "")
	e.set("gone", func(context.Context) (int, []byte, error) {
		return -1, nil, errors.New("exec in web: \"gone\": no such program")
	})
	p := newProber(t, Options{Exec: e})
	err := p.Set([]Target{
		{Name: "a", Identity: "1", Checks: render.Checks{Readiness: execCheck("ok")}},
		{Name: "b", Identity: "1", Checks: render.Checks{Readiness: execCheck("/usr/bin/pg_isready", "-h", "secret-host")}},
		{Name: "c", Identity: "1", Checks: render.Checks{Readiness: execCheck("silent")}},
		{Name: "d", Identity: "1", Checks: render.Checks{Readiness: execCheck("gone")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, p, "a", "ready", isReady)
	for name, want := range map[string]string{
		"b": "readiness: exec pg_isready: exit status 3: db down: no connection",
		"c": "readiness: exec silent: exit status 1",
		"d": `readiness: exec gone: exec in web: "gone": no such program`,
	} {
		s := waitFor(t, p, name, "it fails", func(s Status) bool { return s.Failure != "" })
		if s.Ready || s.Failure != want {
			t.Errorf("%s: %+v; want not ready, failure %q", name, s, want)
		}
	}

	// Without an Execer, exec checks fail and say why.
	p = newProber(t, Options{})
	if err := p.Set([]Target{{Name: "a", Identity: "1", Checks: render.Checks{Readiness: execCheck("ok")}}}); err != nil {
		t.Fatal(err)
	}
	s := waitFor(t, p, "a", "it fails", func(s Status) bool { return s.Failure != "" })
	if want := "readiness: exec ok: this node's driver cannot run exec checks"; s.Failure != want {
		t.Errorf("without an Execer: %q, want %q", s.Failure, want)
	}
}

// A failure fits a report: printable, at most MaxFailure bytes, at most
// the first line of the output cut.
func TestFailureBounded(t *testing.T) {
	e := newExecer()
	e.exit("check", 1, "bad\x1b[31m "+strings.Repeat("é", 400)+"\nnext")
	long := strings.Repeat("x", 1000)
	e.exit(long, 1, "")
	p := newProber(t, Options{Exec: e})
	err := p.Set([]Target{
		{Name: "a", Identity: "1", Checks: render.Checks{Readiness: execCheck("check")}},
		{Name: "b", Identity: "1", Checks: render.Checks{Readiness: execCheck(long)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := waitFor(t, p, "a", "it fails", func(s Status) bool { return s.Failure != "" })
	if !strings.HasPrefix(s.Failure, "readiness: exec check: exit status 1: bad?[31m é") || !strings.HasSuffix(s.Failure, "é…") ||
		len(s.Failure) > len("readiness: exec check: exit status 1: ")+maxExecLine {
		t.Errorf("failure %q (%d bytes)", s.Failure, len(s.Failure))
	}
	s = waitFor(t, p, "b", "it fails", func(s Status) bool { return s.Failure != "" })
	if len(s.Failure) > MaxFailure || !strings.HasSuffix(s.Failure, "…") {
		t.Errorf("failure of %d bytes: %q", len(s.Failure), s.Failure)
	}
}

// A run is bounded by its check's timeout: a server that accepts and
// never answers, an exec that hangs.
func TestTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	held := make(chan net.Conn, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c // never answered
		}
	}()
	t.Cleanup(func() {
		for len(held) > 0 {
			(<-held).Close()
		}
	})
	e := newExecer()
	e.set("hang", hang)
	p := newProber(t, Options{Exec: e})
	timeout := render.Duration(200 * time.Millisecond)
	silent := &render.Check{HTTP: &render.HTTPCheck{Port: ln.Addr().(*net.TCPAddr).Port, Path: "/"}, Timeout: timeout}
	hung := &render.Check{Exec: &render.ExecCheck{Command: []string{"hang"}}, Timeout: timeout}
	err = p.Set([]Target{
		{Name: "silent", Address: loopback, Identity: "1", Checks: render.Checks{Readiness: silent}},
		{Name: "hung", Identity: "1", Checks: render.Checks{Readiness: hung}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"silent": "readiness: http GET /: timed out after 200ms",
		"hung":   "readiness: exec hang: timed out after 200ms",
	} {
		s := waitFor(t, p, name, "it fails", func(s Status) bool { return s.Failure != "" })
		if s.Failure != want {
			t.Errorf("%s: %q, want %q", name, s.Failure, want)
		}
	}
}

// Readiness turns ready after SuccessThreshold passes in a row, and
// unready after FailureThreshold failures in a row, run by run.
func TestReadinessThresholds(t *testing.T) {
	st := newStepper()
	p := newProber(t, Options{Exec: st})
	c := execCheck("check")
	c.SuccessThreshold, c.FailureThreshold = 2, 3
	if err := p.Set([]Target{{Name: "web", Identity: "1", Checks: render.Checks{Readiness: c}}}); err != nil {
		t.Fatal(err)
	}
	pass, fail := result{0, ""}, result{1, "down"}
	steps := []struct {
		give  result
		ready bool
	}{
		{pass, false}, {fail, false}, {pass, false}, {pass, true}, // two in a row
		{fail, true}, {fail, true}, {pass, true}, {fail, true}, {fail, true}, {fail, false}, // three in a row
		{pass, false}, {pass, true},
	}
	reply := st.next(t)
	for i, s := range steps {
		reply <- s.give
		reply = st.next(t) // the run is recorded once the next one begins
		got, _ := p.Status("web")
		if got.Ready != s.ready {
			t.Fatalf("after run %d: Ready = %v, want %v (%+v)", i+1, got.Ready, s.ready, got)
		}
		if wantFailure := s.give.code != 0; (got.Failure != "") != wantFailure {
			t.Errorf("after run %d: Failure %q", i+1, got.Failure)
		}
	}
	reply <- pass
}

// Until a check first passes, its failures count at most once a period:
// the fast runs find a pass sooner, never a failure sooner.
func TestFailuresCountOncePerPeriod(t *testing.T) {
	st := newStepper()
	p := newProber(t, Options{Exec: st})
	// The clock that spaces the failures: each run begins at the next
	// time in the list.
	period := 10 * time.Second
	base := time.Now()
	begins := []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond, 9 * time.Second, 10 * time.Second, 12 * time.Second, 20 * time.Second}
	var n atomic.Int64
	p.mono = func() time.Time { return base.Add(begins[min(int(n.Add(1))-1, len(begins)-1)]) }
	p.sleep = func(ctx context.Context, _ time.Duration) bool { return ctx.Err() == nil }
	c := execCheck("live")
	c.Period, c.FailureThreshold = render.Duration(period), 3
	if err := p.Set([]Target{{Name: "web", Identity: "1", Checks: render.Checks{Liveness: c}}}); err != nil {
		t.Fatal(err)
	}
	fail := result{1, "down"}
	// Runs at 0, 0.1, 0.3 and 9 s count once; at 10 s twice; at 12 s
	// not; at 20 s three times: failed.
	reply := st.next(t)
	for i := range 6 {
		reply <- fail
		reply = st.next(t)
		if s, _ := p.Status("web"); s.LivenessFailed {
			t.Fatalf("liveness failed after run %d, at %v", i+1, begins[i])
		}
	}
	reply <- fail
	s := waitFor(t, p, "web", "liveness failed", func(s Status) bool { return s.LivenessFailed })
	if s.Failure != "liveness: exec live: exit status 1: down" || s.Ready {
		t.Errorf("%+v", s)
	}
}

// The startup check holds the others off until it passes; a startup
// check that fails its threshold asks for a restart.
func TestStartup(t *testing.T) {
	e := newExecer()
	e.exit("started", 1, "not yet")
	e.exit("ready", 0, "")
	e.exit("live", 0, "")
	p := newProber(t, Options{Exec: e})
	startup := execCheck("started")
	startup.FailureThreshold = 1000
	checks := render.Checks{Startup: startup, Readiness: execCheck("ready"), Liveness: execCheck("live")}
	if err := p.Set([]Target{{Name: "web", Identity: "1", Checks: checks}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the startup check ran 4 times", func() bool { return e.count("started") >= 4 })
	if s, _ := p.Status("web"); s.Ready || s.StartupPassed || s.Failure != "startup: exec started: exit status 1: not yet" {
		t.Errorf("while starting: %+v", s)
	}
	if n, m := e.count("ready"), e.count("live"); n != 0 || m != 0 {
		t.Errorf("readiness ran %d times, liveness %d times before the startup check passed", n, m)
	}
	e.exit("started", 0, "")
	s := waitFor(t, p, "web", "ready", isReady)
	if !s.StartupPassed || s.Failure != "" {
		t.Errorf("%+v", s)
	}
	waitFor(t, p, "web", "liveness ran", func(Status) bool { return e.count("live") > 0 })

	// A startup check that keeps failing (a new process: the same one
	// would keep its readiness, its startup check passed).
	e.exit("stuck", 1, "")
	startup = execCheck("stuck")
	startup.FailureThreshold = 1
	if err := p.Set([]Target{{Name: "web", Identity: "2", Checks: render.Checks{Startup: startup, Readiness: execCheck("ready")}}}); err != nil {
		t.Fatal(err)
	}
	s = waitFor(t, p, "web", "the startup failure", func(s Status) bool { return s.LivenessFailed })
	if s.Ready || s.StartupPassed || s.Failure != "startup: exec stuck: exit status 1" {
		t.Errorf("%+v", s)
	}
}

// A liveness failure is signalled, makes the target unready and stops
// its checks; a new identity (the restarted process) starts it again.
func TestLivenessFailureAndRestart(t *testing.T) {
	e := newExecer()
	g := newGate()
	e.set("ready", g.program)
	e.exit("live", 0, "")
	p := newProber(t, Options{Exec: e})
	live := execCheck("live")
	live.FailureThreshold = 2
	checks := render.Checks{Readiness: execCheck("ready"), Liveness: live}
	if err := p.Set([]Target{{Name: "web", Identity: "pid-1", Checks: checks}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, p, "web", "ready", isReady)
	<-p.Changes()
	e.exit("live", 1, "deadlocked")
	s := waitFor(t, p, "web", "liveness failed", func(s Status) bool { return s.LivenessFailed })
	if s.Ready || s.Failure != "liveness: exec live: exit status 1: deadlocked" {
		t.Errorf("%+v", s)
	}
	select {
	case <-p.Changes():
	case <-time.After(10 * time.Second):
		t.Fatal("the liveness failure was not signalled")
	}

	// The same process: nothing changes, its checks stay stopped.
	if err := p.Set([]Target{{Name: "web", Identity: "pid-1", Checks: checks}}); err != nil {
		t.Fatal(err)
	}
	if s, _ := p.Status("web"); !s.LivenessFailed {
		t.Errorf("Set with the same identity reset it: %+v", s)
	}
	// The restarted process.
	e.exit("live", 0, "")
	g.shut()
	if err := p.Set([]Target{{Name: "web", Identity: "pid-2", Checks: checks}}); err != nil {
		t.Fatal(err)
	}
	if s, _ := p.Status("web"); s != (Status{StartupPassed: true}) {
		t.Errorf("after a new identity: %+v, want a fresh start", s)
	}
	g.open()
	waitFor(t, p, "web", "ready again", isReady)
}

// A new identity, address or checks start a target from scratch; the same
// ones leave it as it is.
func TestSetResets(t *testing.T) {
	e := newExecer()
	g := newGate()
	e.set("ready", g.program)
	e.set("other", g.program)
	p := newProber(t, Options{Exec: e})
	tg := Target{Name: "web", Address: loopback, Identity: "1", Checks: render.Checks{Readiness: execCheck("ready")}}
	if err := p.Set([]Target{tg}); err != nil {
		t.Fatal(err)
	}
	ready := waitFor(t, p, "web", "ready", isReady)
	same := tg
	same.Checks.Readiness = execCheck("ready") // equal, not the same pointer
	if err := p.Set([]Target{same}); err != nil {
		t.Fatal(err)
	}
	if s, _ := p.Status("web"); s != ready {
		t.Errorf("Set of the same target: %+v, was %+v", s, ready)
	}
	for name, change := range map[string]func(*Target){
		"identity": func(t *Target) { t.Identity = "2" },
		"address":  func(t *Target) { t.Address = loopback.Next() },
	} {
		next := tg
		change(&next)
		g.shut() // no run passes until the status is read
		if err := p.Set([]Target{next}); err != nil {
			t.Fatal(err)
		}
		if s, _ := p.Status("web"); s.Ready {
			t.Errorf("a new %s kept it ready: %+v", name, s)
		}
		g.open()
		waitFor(t, p, "web", "ready again", isReady)
		tg = next
	}
	// New checks for the same process (a live change of the spec): it
	// stays ready, since when it was, while the new check takes over.
	ready, _ = p.Status("web")
	next := tg
	next.Checks.Readiness = execCheck("other")
	g.shut()
	if err := p.Set([]Target{next}); err != nil {
		t.Fatal(err)
	}
	if s, _ := p.Status("web"); !s.Ready || !s.ReadySince.Equal(ready.ReadySince) {
		t.Errorf("new checks for the same process: %+v, want it still ready since %s", s, ready.ReadySince)
	}
	g.open()
	waitFor(t, p, "web", "the new check passing", func(s Status) bool { return s.Ready && s.Failure == "" })
	if err := p.Set(nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Status("web"); ok {
		t.Errorf("a target removed is still known")
	}
	err := p.Set([]Target{{Name: "a", Identity: "1"}, {Name: "a", Identity: "2"}, {Identity: "3"}})
	if err == nil || !strings.Contains(err.Error(), "listed twice") || !strings.Contains(err.Error(), "without a name") {
		t.Errorf("Set of bad targets: %v", err)
	}
	if _, ok := p.Status("a"); !ok {
		t.Errorf("the first of a duplicate was not kept")
	}
}

// A listener that appears after the instance started makes it ready
// within about one of the fast runs, not a period later.
func TestLateListener(t *testing.T) {
	port := closedPort(t)
	p := newProber(t, Options{})
	c := tcpCheck(port)
	c.Period = render.Duration(time.Minute)
	if err := p.Set([]Target{{Name: "web", Address: loopback, Identity: "1", Checks: render.Checks{Readiness: c}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, p, "web", "the first failure", func(s Status) bool { return s.Failure != "" })
	time.Sleep(300 * time.Millisecond) // the instance binds its port late
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	defer ln.Close()
	bound := time.Now()
	waitFor(t, p, "web", "ready", isReady) // 15 s at most, a period is 60
	t.Logf("ready %v after the port was bound", time.Since(bound).Round(time.Millisecond))
}

// At most MaxConcurrent runs are in flight at once, all targets together.
func TestConcurrencyBound(t *testing.T) {
	e := newExecer()
	release := make(chan struct{})
	e.set("slow", func(ctx context.Context) (int, []byte, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return 0, nil, nil
	})
	p := newProber(t, Options{Exec: e, MaxConcurrent: 4})
	var targets []Target
	for i := range 30 {
		targets = append(targets, Target{Name: fmt.Sprintf("web-%d", i), Identity: "1",
			Checks: render.Checks{Readiness: execCheck("slow"), Liveness: execCheck("slow")}})
	}
	if err := p.Set(targets); err != nil {
		t.Fatal(err)
	}
	eventually(t, "4 runs are in flight", func() bool { return e.inFlight.Load() >= 4 })
	close(release)
	for _, tg := range targets {
		waitFor(t, p, tg.Name, "ready", isReady)
	}
	if most := e.most.Load(); most != 4 {
		t.Errorf("%d runs were in flight at once, want 4", most)
	}
}

// Close stops every check, kills the runs in flight and returns once
// every goroutine of the Prober has ended.
func TestCloseWaits(t *testing.T) {
	before := runtime.NumGoroutine()
	e := newExecer()
	e.set("hang", hang)
	e.exit("ok", 0, "")
	_, port := listen(t)
	p := New(Options{Exec: e})
	var targets []Target
	for i := range 10 {
		targets = append(targets, Target{Name: fmt.Sprintf("web-%d", i), Address: loopback, Identity: "1",
			Checks: render.Checks{Readiness: execCheck("hang"), Liveness: tcpCheck(port)}})
	}
	if err := p.Set(targets); err != nil {
		t.Fatal(err)
	}
	eventually(t, "10 runs are in flight", func() bool { return e.inFlight.Load() >= 10 })
	p.Close()
	if n := e.inFlight.Load(); n != 0 {
		t.Errorf("%d runs still in flight after Close", n)
	}
	if err := p.Set(targets); !errors.Is(err, ErrClosed) {
		t.Errorf("Set after Close: %v", err)
	}
	// What net/http started for the connections ends with them.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+1 { // the listener's accept loop
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The prober keeps its own copy of the checks: a change the caller makes
// to its model afterwards reaches no run (and is no data race).
func TestSetCopiesChecks(t *testing.T) {
	e := newExecer()
	e.exit("ready", 0, "")
	e.exit("changed", 1, "")
	p := newProber(t, Options{Exec: e})
	c := execCheck("ready")
	if err := p.Set([]Target{{Name: "web", Identity: "1", Checks: render.Checks{Readiness: c}}}); err != nil {
		t.Fatal(err)
	}
	c.Exec.Command[0] = "changed"
	c.SuccessThreshold = 50
	waitFor(t, p, "web", "ready", isReady)
	if n := e.count("changed"); n != 0 {
		t.Errorf("the changed command ran %d times", n)
	}
}

// Until it first passes, a tcp or http check runs at most StartPaceFast
// apart during StartFastWindow while its connections are refused (an
// instance that binds late is seen ready soon after it does), StartPace
// apart until StartWindow otherwise (an application that accepts but is
// still warming up is not asked a hundred times a second), then at twice
// the previous interval up to its period; an exec check doubles from the
// start.
func TestStartPace(t *testing.T) {
	warming := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(warming.Close)
	for _, tc := range []struct {
		name  string
		check *render.Check
		want  []time.Duration
	}{
		{"tcp", &render.Check{TCP: &render.TCPCheck{Port: 1}, Period: render.Duration(time.Second)},
			[]time.Duration{5, 10, 10, 10, 20, 40, 50, 50, 100, 200, 400, 800, 1000}},
		{"http answering 503", &render.Check{HTTP: &render.HTTPCheck{Port: warming.Listener.Addr().(*net.TCPAddr).Port, Path: "/"}, Period: render.Duration(time.Second)},
			[]time.Duration{5, 10, 20, 40, 50, 50, 50, 50, 100, 200, 400, 800, 1000}},
		{"exec", &render.Check{Exec: &render.ExecCheck{Command: []string{"false"}}, Period: render.Duration(time.Second)},
			[]time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000, 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newExecer()
			e.exit("false", 1, "")
			p := newProber(t, Options{Exec: e})
			// Each run begins 500 ms after the one before (in the clock
			// that spaces them): the window ends at the seventh run.
			base := time.Now()
			var runs atomic.Int64
			p.mono = func() time.Time { return base.Add(time.Duration(runs.Add(1)-1) * 500 * time.Millisecond) }
			var mu sync.Mutex
			var slept []time.Duration
			p.sleep = func(ctx context.Context, d time.Duration) bool {
				mu.Lock()
				full := len(slept) >= len(tc.want)
				if !full {
					slept = append(slept, d/time.Millisecond)
				}
				mu.Unlock()
				if full {
					<-ctx.Done()
				}
				return ctx.Err() == nil
			}
			c := tc.check
			c.FailureThreshold = 1000
			if err := p.Set([]Target{{Name: "web", Identity: "1", Address: loopback, Checks: render.Checks{Readiness: c}}}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "all the runs", func() bool { mu.Lock(); defer mu.Unlock(); return len(slept) == len(tc.want) })
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(slept, tc.want) {
				t.Errorf("intervals (ms) %v, want %v", slept, tc.want)
			}
		})
	}
}
