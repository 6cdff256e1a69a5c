package fake_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/nodeexec/fake"
)

func TestExec(t *testing.T) {
	ctx := t.Context()
	d := fake.New()
	if _, _, err := d.Exec(ctx, "web-0", []string{"check"}, 10); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec in a missing instance: %v; want ErrNotFound", err)
	}
	if _, err := d.Start(ctx, spec("web-0")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Exec(ctx, "web-0", []string{"check"}, 10); err == nil || errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec of a missing program: %v; want an error other than not found", err)
	}
	healthy := true
	d.SetExec("web-0", func(ctx context.Context, argv, env []string) (int, []byte, error) {
		if !slices.Contains(env, "KEEL_INSTANCE=web-0") {
			return -1, nil, errors.New("not the instance's environment")
		}
		if argv[0] == "hang" {
			<-ctx.Done()
			return -1, nil, ctx.Err()
		}
		if !healthy {
			return 1, []byte("unhealthy: " + argv[1]), nil
		}
		return 0, []byte("ok"), nil
	})
	if code, out, err := d.Exec(ctx, "web-0", []string{"check", "$KEEL_INSTANCE"}, 10); code != 0 || string(out) != "ok" || err != nil {
		t.Errorf("Exec = %d, %q, %v; want 0, ok", code, out, err)
	}
	healthy = false
	if code, out, err := d.Exec(ctx, "web-0", []string{"check", "$KEEL_INSTANCE"}, 14); code != 1 || string(out) != "unhealthy: web" || err != nil {
		t.Errorf("Exec = %d, %q, %v; want 1 and the output cut to 14 bytes", code, out, err)
	}
	if n, last := d.Execs("web-0"); n != 2 || !slices.Equal(last, []string{"check", "web-0"}) {
		t.Errorf("Execs = %d, %q; want 2, the expanded argv", n, last)
	}

	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, _, err := d.Exec(tctx, "web-0", []string{"hang"}, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Exec of a check that hangs: %v; want the deadline", err)
	}

	// The programs stay through an agent restart and a restart of the
	// instance; a stopped instance runs nothing.
	healthy = true
	d.AgentRestart()
	if code, _, err := d.Exec(ctx, "web-0", []string{"check", "x"}, 10); code != 0 || err != nil {
		t.Errorf("Exec after AgentRestart = %d, %v", code, err)
	}
	if err := d.Stop(ctx, "web-0", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Exec(ctx, "web-0", []string{"check", "x"}, 10); !errors.Is(err, nodeexec.ErrNotFound) {
		t.Errorf("Exec in a stopped instance: %v; want ErrNotFound", err)
	}
	if _, err := d.Start(ctx, spec("web-0")); err != nil {
		t.Fatal(err)
	}
	if code, _, err := d.Exec(ctx, "web-0", []string{"check", "x"}, 10); code != 0 || err != nil {
		t.Errorf("Exec after a restart = %d, %v", code, err)
	}
}
