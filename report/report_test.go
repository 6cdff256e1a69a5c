package report_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/keel-dev/keel/report"
)

func sample() report.Report {
	return report.Report{
		Node: "n1", Time: time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC), AgentVersion: "0.1.0",
		Commit: "0123abcd", PlanID: "feed", Capacity: report.Capacity{CPU: 8000, Memory: 32 << 30},
		Instances: []report.Instance{
			{Name: "web-1", State: report.StateRunning, Address: netip.MustParseAddr("10.200.1.3"), SpecHash: "aa", Restarts: 2},
			{Name: "web-0", State: report.StateCrashLoop, Address: netip.MustParseAddr("10.200.1.2"), SpecHash: "bb", Error: "exit status 1"},
		},
		Volumes:      []report.Volume{{Name: "db-0-data"}},
		Certificates: []report.Certificate{{Host: "www.example.com", Expires: time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC)}},
		Refused:      &report.Refusal{Commit: "beef", Reason: "specs invalid"},
	}
}

func TestRoundTripAndCanonicalOrder(t *testing.T) {
	data := sample().Marshal()
	got, err := report.Parse(data, "n1")
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, data)
	}
	if got.Instances[0].Name != "web-0" {
		t.Errorf("instances not sorted in the canonical form: %v", got.Instances)
	}
	if string(got.Marshal()) != string(data) {
		t.Errorf("marshal is not stable:\n%s\nvs\n%s", data, got.Marshal())
	}
	for _, want := range []string{"apiVersion: keel/v1", "kind: Report", "cpu: \"8\"", "memory: 32G", "address: 10.200.1.2", "refused:"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("report lacks %q:\n%s", want, data)
		}
	}
}

func TestUnknownFieldsAreTolerated(t *testing.T) {
	data := string(sample().Marshal()) + "futureField: {x: 1}\n"
	if _, err := report.Parse([]byte(data), "n1"); err != nil {
		t.Fatalf("a report from a newer agent must parse: %v", err)
	}
}

func TestInvalidReports(t *testing.T) {
	good := string(sample().Marshal())
	cases := []struct{ name, data, ref, want string }{
		{"other node", good, "n2", `names node "n1" but is published for node "n2"`},
		{"not yaml", "{{{", "n1", "does not parse"},
		{"wrong kind", strings.Replace(good, "kind: Report", "kind: Jail", 1), "n1", "not a report"},
		{"bad state", strings.Replace(good, "state: running", "state: dancing", 1), "n1", "is not a state"},
		{"bad address", strings.Replace(good, "address: 10.200.1.3", "address: 10.200.1.300", 1), "n1", "not an IPv4 address"},
		{"string restarts", strings.Replace(good, "restarts: 2", "restarts: two", 1), "n1", "does not parse"},
		{"bad cpu", strings.Replace(good, `cpu: "8"`, `cpu: lots`, 1), "n1", "capacity.cpu"},
		{"no time", strings.Replace(good, "time: 2026-11-29T14:00:00Z", "time: null", 1), "n1", "no time"},
		{"bad instance name", strings.Replace(good, "name: web-1", "name: ../etc", 1), "n1", "not a valid name"},
		{"too large", good + "x: " + strings.Repeat("a", 5<<20) + "\n", "n1", "more than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := report.Parse([]byte(c.data), c.ref)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add(sample().Marshal())
	f.Add([]byte("apiVersion: keel/v1\nkind: Report\nnode: n1\ntime: 2026-01-01T00:00:00Z\ninstances: [{name: a, state: running}]\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Add([]byte("apiVersion: keel/v1\nkind: Report\nnode: n1\ntime: 2026-01-01T00:00:00Z\nproblems: [{check: racct, problem: off, fix: on}, {check: datasets, problem: b}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := report.Parse(data, "n1")
		if err != nil {
			return
		}
		// Whatever parses must survive a round trip unchanged.
		again, err := report.Parse(r.Marshal(), "n1")
		if err != nil {
			t.Fatalf("a parsed report does not parse after Marshal: %v\n%s", err, r.Marshal())
		}
		if string(again.Marshal()) != string(r.Marshal()) {
			t.Fatalf("round trip changed the report:\n%s\nvs\n%s", r.Marshal(), again.Marshal())
		}
	})
}

func TestClockAndGeneration(t *testing.T) {
	r := sample()
	r.Clock = r.Time.Add(-3 * time.Second)
	r.Instances[0].Generation = 4
	got, err := report.Parse(r.Marshal(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Clock.Equal(r.Clock) || !got.SenderClock().Equal(r.Clock) || got.Instance("web-1").Generation != 4 {
		t.Fatalf("clock %s, generation %d", got.Clock, got.Instance("web-1").Generation)
	}
	old := sample()
	if s := string(old.Marshal()); strings.Contains(s, "clock:") || strings.Contains(s, "generation:") {
		t.Fatalf("zero clock and generation are written:\n%s", s)
	}
	if o, _ := report.Parse(old.Marshal(), "n1"); !o.SenderClock().Equal(old.Time) {
		t.Fatal("without clock, the sender clock is the time")
	}
	for _, bad := range []string{"generation: -1", "generation: 2000000000"} {
		data := strings.Replace(string(r.Marshal()), "generation: 4", bad, 1)
		if _, err := report.Parse([]byte(data), "n1"); err == nil || !strings.Contains(err.Error(), "generation") {
			t.Errorf("%s: err %v", bad, err)
		}
	}
}

// Issue 8 item 8: the run start (since) round-trips, is omitted when zero,
// and may not be after the report's time.
func TestSince(t *testing.T) {
	r := sample()
	r.Since = r.Time.Add(-45 * time.Second)
	got, err := report.Parse(r.Marshal(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Since.Equal(r.Since) {
		t.Fatalf("since %s, want %s", got.Since, r.Since)
	}
	if s := string(sample().Marshal()); strings.Contains(s, "since:") {
		t.Fatalf("a zero since is written:\n%s", s)
	}
	r.Since = r.Time
	if _, err := report.Parse(r.Marshal(), "n1"); err != nil {
		t.Fatalf("since equal to time refused: %v", err)
	}
	r.Since = r.Time.Add(time.Millisecond)
	if _, err := report.Parse(r.Marshal(), "n1"); err == nil || !strings.Contains(err.Error(), "since") {
		t.Fatalf("since after time: err %v", err)
	}
}

// Issue 9: a node's host problems round-trip in the canonical order (by
// check as report.Checks lists them), are left out when there are none,
// and say whether the node can enforce resource limits.
func TestProblemsRoundTrip(t *testing.T) {
	r := sample()
	r.Problems = []report.Problem{
		{Check: report.CheckPF, Problem: "pf is not enabled", Fix: "service pf start"},
		{Check: report.CheckRacct, Problem: "resource accounting is off", Fix: "kern.racct.enable=1 in /boot/loader.conf, then reboot"},
		{Check: report.CheckDatasets, Problem: "the dataset zroot/keel/volumes does not exist", Fix: "zfs create -p zroot/keel/volumes"},
		{Check: report.CheckDatasets, Problem: "the dataset zroot/keel/jails does not exist", Fix: "zfs create -p zroot/keel/jails"},
	}
	data := r.Marshal()
	got, err := report.Parse(data, "n1")
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, data)
	}
	var checks []string
	for _, p := range got.Problems {
		checks = append(checks, p.Check)
	}
	if want := []string{"datasets", "datasets", "racct", "pf"}; strings.Join(checks, ",") != strings.Join(want, ",") {
		t.Errorf("problems in the order %v, want %v", checks, want)
	}
	if got.Problems[0].Problem != "the dataset zroot/keel/jails does not exist" || got.Problems[3].Fix != "service pf start" {
		t.Errorf("problems changed: %+v", got.Problems)
	}
	if string(got.Marshal()) != string(data) {
		t.Errorf("marshal is not stable:\n%s\nvs\n%s", data, got.Marshal())
	}
	if !strings.Contains(string(data), "problems:\n  - check: datasets\n") {
		t.Errorf("problems not written as documented:\n%s", data)
	}
	if !got.LimitsOff() {
		t.Error("a report with a racct problem does not say limits are off")
	}
	if s := string(sample().Marshal()); strings.Contains(s, "problems") {
		t.Errorf("a report without problems lists them:\n%s", s)
	}
	if r := sample(); r.LimitsOff() {
		t.Error("a report without problems says limits are off")
	}
}

// Issue 9: a problem of an unknown check, an empty or oversize text, or
// too many problems make the report unreadable, as any other broken field.
func TestInvalidProblems(t *testing.T) {
	with := func(ps ...report.Problem) string {
		r := sample()
		r.Problems = ps
		return string(r.Marshal())
	}
	ok := report.Problem{Check: report.CheckRacct, Problem: "off", Fix: "on"}
	many := make([]report.Problem, report.MaxProblems+1)
	for i := range many {
		many[i] = report.Problem{Check: report.CheckDatasets, Problem: fmt.Sprintf("dataset %d", i)}
	}
	long := strings.Repeat("x", report.MaxProblemText+1)
	cases := []struct{ name, data, want string }{
		{"unknown check", with(report.Problem{Check: "kernel", Problem: "x"}), `problems[0].check: "kernel" is not a check`},
		{"empty check", with(report.Problem{Problem: "x"}), "problems[0].check"},
		{"oversize check", with(report.Problem{Check: strings.Repeat("racct", 1000), Problem: "x"}), "is not a check"},
		{"empty problem", with(ok, report.Problem{Check: report.CheckPF}), "problems[1].problem: empty"},
		{"oversize problem", with(report.Problem{Check: report.CheckPF, Problem: long}), "512 bytes each"},
		{"oversize fix", with(report.Problem{Check: report.CheckPF, Problem: "x", Fix: long}), "512 bytes each"},
		{"too many", with(many...), "33 listed, more than the 32 allowed"},
		{"not a list", strings.Replace(with(ok), "problems:\n  - check: racct\n    problem: \"off\"\n    fix: \"on\"\n", "problems: racct\n", 1), "does not parse"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := report.Parse([]byte(c.data), "n1")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q\n%s", err, c.want, c.data)
			}
			if err != nil && len(err.Error()) > 400 {
				t.Errorf("the error echoes the input: %d bytes", len(err.Error()))
			}
		})
	}
	if _, err := report.Parse([]byte(with(ok)), "n1"); err != nil {
		t.Fatalf("a valid problem is refused: %v", err)
	}
}

// Issue 9: TrimProblems makes whatever a driver says fit a report that
// readers accept: unknown checks and empty texts dropped, texts cut at a
// UTF-8 boundary, the count capped.
func TestTrimProblems(t *testing.T) {
	in := []report.Problem{
		{Check: "kernel", Problem: "from a newer driver"},
		{Check: report.CheckPF, Problem: ""},
		{Check: report.CheckRacct, Problem: strings.Repeat("é", report.MaxProblemText), Fix: strings.Repeat("f", report.MaxProblemText+7)},
	}
	for i := range report.MaxProblems + 3 {
		in = append(in, report.Problem{Check: report.CheckDatasets, Problem: fmt.Sprintf("dataset %02d", i)})
	}
	got, dropped := report.TrimProblems(in)
	if len(got) != report.MaxProblems || dropped != 2+4 {
		t.Fatalf("kept %d, dropped %d; want %d and 6", len(got), dropped, report.MaxProblems)
	}
	for _, p := range got {
		if p.Check == report.CheckRacct {
			t.Errorf("the racct problem sorts after datasets and was cut off by the cap, yet kept: %+v", p)
		}
	}
	got, dropped = report.TrimProblems(in[:3])
	if len(got) != 1 || dropped != 2 {
		t.Fatalf("kept %v, dropped %d", got, dropped)
	}
	p := got[0]
	if len(p.Problem) > report.MaxProblemText || !utf8.ValidString(p.Problem) || !strings.HasSuffix(p.Problem, "…") ||
		len(p.Fix) > report.MaxProblemText || !strings.HasSuffix(p.Fix, "…") {
		t.Errorf("texts not cut to %d bytes of valid UTF-8: %d %d", report.MaxProblemText, len(p.Problem), len(p.Fix))
	}
	r := sample()
	r.Problems, _ = report.TrimProblems(in)
	if _, err := report.Parse(r.Marshal(), "n1"); err != nil {
		t.Fatalf("a report of trimmed problems is refused: %v", err)
	}
}

// Issue 10: the certificates a node reports are checked as everything else
// in a report: a host that is not a host name, a serial that is not hex, an
// oversize error, or too many entries make the report unreadable; a valid
// entry reads back with its serial and issuer.
func TestInvalidCertificates(t *testing.T) {
	with := func(cs ...report.Certificate) string {
		r := sample()
		r.Certificates = cs
		return string(r.Marshal())
	}
	at := time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)
	ok := report.Certificate{Host: "www.example.com", Expires: at, Serial: "0badcafe", Issuer: "Pebble Intermediate CA"}
	many := make([]report.Certificate, report.MaxCertificates+1)
	for i := range many {
		many[i] = report.Certificate{Host: fmt.Sprintf("h%d.example.com", i)}
	}
	cases := []struct{ name, data, want string }{
		{"empty host", with(report.Certificate{}), "certificates[0].host"},
		{"host with a slash", with(ok, report.Certificate{Host: "a/../b"}), "certificates[0].host"},
		{"upper case host", with(report.Certificate{Host: "WWW.example.com"}), "certificates[0].host"},
		{"serial not hex", with(report.Certificate{Host: "a.example.com", Serial: "zz"}), "certificates[0].serial"},
		{"oversize error", with(report.Certificate{Host: "a.example.com", Error: strings.Repeat("x", report.MaxProblemText+1)}), "certificates[0]"},
		{"too many", with(many...), "more than the 4096 allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := report.Parse([]byte(c.data), "n1")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	got, err := report.Parse([]byte(with(ok)), "n1")
	if err != nil {
		t.Fatalf("a valid certificate is refused: %v", err)
	}
	if len(got.Certificates) != 1 || got.Certificates[0] != ok {
		t.Fatalf("read back %+v, want %+v", got.Certificates, ok)
	}
	if !ok.Holds(at.Add(-time.Second)) || ok.Holds(at) || (report.Certificate{Host: "x.example.com", Error: "failed"}).Holds(at) {
		t.Error("Holds: want true only for a certificate not yet expired")
	}
}

// TestContentDigest: the digest leaves out when a report was made (a
// heartbeat) and changes with anything it says; a report read back from
// its bytes has the digest of the one written, so that a peer compares
// what it fetched with what the node announced.
func TestContentDigest(t *testing.T) {
	r := sample()
	r.Services = []report.Service{{Name: "web", VIP: "10.201.0.1", Endpoints: []string{}}}
	r.Problems = []report.Problem{{Check: report.Checks[0], Problem: "p", Fix: "f"}}
	d := report.ContentDigest(r)
	if len(d) != 32 || strings.Trim(d, "0123456789abcdef") != "" {
		t.Fatalf("digest %q is not 32 lowercase hex digits", d)
	}
	beat := r
	beat.Time, beat.Clock, beat.Since = r.Time.Add(time.Minute), r.Time.Add(time.Minute), r.Time.Add(-time.Hour)
	if report.ContentDigest(beat) != d {
		t.Error("a heartbeat (new time, clock, since) changed the digest")
	}
	back, err := report.Parse(beat.Marshal(), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if report.ContentDigest(back) != d {
		t.Errorf("the report read back has another digest:\n%s", beat.Marshal())
	}
	changed := r
	changed.Instances = append([]report.Instance(nil), r.Instances...)
	changed.Instances[0].State = report.StateStopped
	if report.ContentDigest(changed) == d {
		t.Error("a changed instance state kept the digest")
	}
}
