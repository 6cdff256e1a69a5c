package dns01

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// execPath is the PATH a hook runs with unless its env sets one: the
// agent's own environment is not passed on (it may hold the agent's
// credentials), so the hook gets only this and its configured env.
const execPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// execOutputMax bounds what is kept of a hook's output (stdout and stderr
// together); the rest is counted and dropped, the hook never blocks on it.
const execOutputMax = 4 << 10

// execWaitDelay bounds the wait for the hook's output pipes once it has
// exited or been killed (a grandchild that kept them open).
const execWaitDelay = 2 * time.Second

// execHook runs a configured program with an exact argv, never through a
// shell: command... present|cleanup <fqdn> <value>.
type execHook struct {
	command     []string
	timeout     time.Duration
	env         []string
	errorOutput bool
}

func newExecHook(c *config) *execHook {
	h := &execHook{command: c.Command, timeout: c.Timeout, errorOutput: c.ErrorOutput}
	hasPath := false
	for _, kv := range c.Env {
		h.env = append(h.env, kv[0]+"="+kv[1])
		hasPath = hasPath || kv[0] == "PATH"
	}
	if !hasPath {
		h.env = append(h.env, "PATH="+execPath)
	}
	return h
}

func (h *execHook) present(ctx context.Context, ch *challenge) error {
	return h.run(ctx, "present", ch)
}

func (h *execHook) cleanup(ctx context.Context, ch *challenge) error {
	return h.run(ctx, "cleanup", ch)
}

func (h *execHook) run(ctx context.Context, action string, ch *challenge) error {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	args := append(append([]string{}, h.command[1:]...), action, ch.fqdn, ch.value)
	cmd := exec.CommandContext(ctx, h.command[0], args...)
	cmd.Env = h.env
	cmd.Dir = "/"
	out := &boundedBuffer{max: execOutputMax}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = execWaitDelay
	ownProcessGroup(cmd)
	err := cmd.Run()
	if err == nil {
		return nil
	}
	var msg string
	var exitErr *exec.ExitError
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		msg = fmt.Sprintf("killed after the %s timeout", h.timeout)
	case errors.As(err, &exitErr):
		msg = exitErr.ProcessState.String() // "exit status 3", "signal: killed"
	default:
		msg = err.Error() // could not start: names the program, not its env
	}
	if h.errorOutput {
		if o := out.String(); o != "" {
			msg += ": output: " + o
		}
	}
	e := fmt.Errorf("hook %s %s: %s", h.command[0], action, msg)
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", e, ctx.Err())
	}
	return e
}

// boundedBuffer keeps the first max bytes written to it and counts the
// rest. Safe for the two copying goroutines of stdout and stderr.
type boundedBuffer struct {
	mu      sync.Mutex
	max     int
	buf     []byte
	dropped int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := min(len(p), b.max-len(b.buf))
	b.buf = append(b.buf, p[:n]...)
	b.dropped += len(p) - n
	return len(p), nil
}

// String returns the output kept, trimmed, with control characters other
// than line breaks and tabs replaced, and the count of bytes dropped.
func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := strings.Map(func(r rune) rune {
		if r < 0x20 && r != '\n' && r != '\t' || r == 0x7f {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(strings.TrimSpace(string(b.buf)), "?"))
	if b.dropped > 0 {
		s += fmt.Sprintf(" [%d more bytes]", b.dropped)
	}
	return s
}
