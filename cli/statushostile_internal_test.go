package cli

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/status"
	"github.com/keel-dev/keel/status/statustest"
)

// hostile is report text that would rewrite the operator's terminal if it
// reached it raw: an OSC title and clipboard write, a carriage return
// over the line, a screen clear, an 8-bit CSI (a lone 0x9b byte), a C1
// CSI rune and a bidi override.
const hostile = "evil\x1b]0;pwned\x07\x1b]52;c;cm0gLXJmIH4=\x07\rOK\x1b[2J\x9b31m\u009b1m\u202etxt.exe"

// hostileStatus is the refused fixture with hostile, and huge, text in
// every report field that reaches the terminal.
func hostileStatus(t *testing.T) *status.Status {
	t.Helper()
	snap, now := statustest.Snapshot(t, "refused")
	huge := hostile + strings.Repeat("A", 1<<20)
	snap.Tip.Author = hostile
	for i := range snap.Reports {
		r := &snap.Reports[i]
		if r.Refused != nil {
			r.Refused.Reason = huge
		}
		r.Problems = append(r.Problems, report.Problem{Check: report.CheckPF, Problem: hostile, Fix: hostile})
		for j := range r.Instances {
			r.Instances[j].State, r.Instances[j].Restarts, r.Instances[j].Error = report.StateCrashLoop, 3, huge
		}
		for j := range r.Certificates {
			r.Certificates[j].Expires, r.Certificates[j].Error = time.Time{}, hostile
		}
	}
	return status.Compute(status.Input{Snapshot: snap, Now: now})
}

// checkTerminalSafe fails when out holds anything a terminal acts on
// besides line feeds (and, with colour, keel's own SGR codes), or a line
// longer than maxLine runes.
func checkTerminalSafe(t *testing.T, what, out string, maxLine int) {
	t.Helper()
	for _, code := range []string{colorRed, colorGreen, colorYellow, colorBold, "0"} {
		out = strings.ReplaceAll(out, "\x1b["+code+"m", "")
	}
	if !utf8.ValidString(out) {
		t.Errorf("%s: invalid UTF-8 reaches the terminal (a lone 0x9b is an 8-bit CSI)", what)
	}
	for _, r := range out {
		if r != '\n' && (unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)) {
			t.Errorf("%s: control character %U reaches the terminal", what, r)
			break
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > maxLine {
			t.Errorf("%s: a line of %d runes (at most %d): %.80q…", what, n, maxLine, line)
			break
		}
	}
}

// TestStatusHostileReports: report text (a refusal's reason, an instance's
// error, a host problem, a certificate's error) and a commit's author are
// written by nodes and pushers, not by keel: in the table, in --check's
// lines and in --watch's error line, no control character reaches the
// operator's terminal, and a megabyte of it is cut.
func TestStatusHostileReports(t *testing.T) {
	st := hostileStatus(t)
	if st.Converged || len(st.Missing) < 2 {
		t.Fatalf("the hostile fixture should not converge: %s", st.Headline)
	}
	for _, color := range []bool{false, true} {
		out := statusTable(st, tableOptions{width: 120, color: color})
		checkTerminalSafe(t, "table", out, maxTerminalText+64)
		if !strings.Contains(out, `evil\x1b]0;pwned\x07`) {
			t.Errorf("the hostile text should show, escaped:\n%.2000s", out)
		}
	}

	var buf bytes.Buffer
	e := &env{ctx: context.Background(), stdout: &buf}
	get := func() (*status.Status, error) { return st, nil }
	if err := e.statusCheck(get, time.Millisecond, 0, tableOptions{width: 120, color: true}); err == nil {
		t.Fatal("--check: converged?")
	}
	checkTerminalSafe(t, "--check", buf.String(), maxTerminalText+64)

	buf.Reset()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	e = &env{ctx: ctx, stdout: &buf}
	get = func() (*status.Status, error) { return nil, errors.New("fetch: remote error: " + hostile) }
	if err := e.statusWatch(get, time.Millisecond, "table", tableOptions{width: 120}, false); err != nil {
		t.Fatal(err)
	}
	checkTerminalSafe(t, "--watch", buf.String(), maxTerminalText+64)
}

// TestStatusCheckReadsAgainAfterAnError: keel status --check --timeout
// (a CI job waiting for the deploy) reads again when a read fails after
// the first (the forge answers 502 for a moment) instead of failing the
// job; the first read's error, and one at the deadline, still end it
// (exit 2).
func TestStatusCheckReadsAgainAfterAnError(t *testing.T) {
	snap, now := statustest.Snapshot(t, "old-commit")
	pending := status.Compute(status.Input{Snapshot: snap, Now: now})
	snap, now = statustest.Snapshot(t, "converged")
	done := status.Compute(status.Input{Snapshot: snap, Now: now})
	blip := errors.New("fetch https://git.example.test/ops/cluster.git: 502 Bad Gateway")
	steps := []struct {
		st  *status.Status
		err error
	}{{pending, nil}, {nil, blip}, {nil, blip}, {done, nil}}
	reads := 0
	get := func() (*status.Status, error) {
		s := steps[min(reads, len(steps)-1)]
		reads++
		return s.st, s.err
	}
	var out, errOut bytes.Buffer
	e := &env{ctx: context.Background(), stdout: &out, stderr: &errOut}
	if err := e.statusCheck(get, time.Millisecond, time.Minute, tableOptions{}); err != nil {
		t.Fatalf("a passing error ended the wait: %v\nstdout:\n%s", err, out.String())
	}
	if reads != 4 || !strings.Contains(errOut.String(), "502 Bad Gateway (reading again)") || !strings.Contains(out.String(), "converged at") {
		t.Errorf("%d reads, stdout %q, stderr %q", reads, out.String(), errOut.String())
	}

	// The first read fails: at once, whatever the timeout.
	e = &env{ctx: context.Background(), stdout: &out, stderr: &errOut}
	if err := e.statusCheck(func() (*status.Status, error) { return nil, blip }, time.Millisecond, time.Hour, tableOptions{}); !errors.Is(err, blip) {
		t.Errorf("first read fails: %v", err)
	}
	// Interrupted while a read fails: not converged (3), not an I/O error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	e = &env{ctx: ctx, stdout: &out, stderr: &errOut}
	var ee *exitError
	if err := e.statusCheck(func() (*status.Status, error) { return nil, ctx.Err() }, time.Millisecond, time.Hour, tableOptions{}); !errors.As(err, &ee) || ee.code != ExitNotConverged {
		t.Errorf("interrupted: %v", err)
	}
}
