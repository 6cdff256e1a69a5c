package report_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

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
