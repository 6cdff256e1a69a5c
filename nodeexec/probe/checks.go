package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/keel-dev/keel/nodeexec"
	"github.com/keel-dev/keel/render"
)

// Bounds on what a run reads.
const (
	// maxExecOutput is what an exec check's output is read up to; its
	// first line, cut to maxExecLine, goes into the failure.
	maxExecOutput = 1024
	maxExecLine   = 128
	// maxBody is how much of an http check's response body is read (and
	// dropped) before the connection is closed.
	maxBody = 4 << 10
	// maxHeaderBytes bounds an http check's response headers.
	maxHeaderBytes = 16 << 10
)

// run runs check c of tg once, within timeout, and returns nil when it
// passes, else why it failed ("http GET /healthz: status 503").
func (p *Prober) run(tg *target, c *render.Check, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(tg.ctx, timeout)
	defer cancel()
	var what string
	var err error
	switch {
	case c.TCP != nil:
		what = "tcp port " + strconv.Itoa(c.TCP.Port)
		err = dialTCP(ctx, tg.Address, c.TCP.Port)
	case c.HTTP != nil:
		what = "http GET " + httpPath(c.HTTP)
		err = p.get(ctx, tg.Address, c.HTTP)
	case c.Exec != nil:
		what = "exec"
		if len(c.Exec.Command) > 0 {
			what += " " + path.Base(c.Exec.Command[0])
		}
		err = p.execCheck(ctx, tg.Name, c.Exec.Command)
	default:
		return errors.New("the check has no tcp, http or exec")
	}
	if err == nil {
		return nil
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%s: timed out after %v", what, timeout)
	}
	return &failure{fmt.Sprintf("%s: %s", what, reason(err)), err}
}

// failure is a check's failure: what the check says of it, and the error
// behind it (a refused connection paces the next run: startPace).
type failure struct {
	msg   string
	cause error
}

func (f *failure) Error() string { return f.msg }
func (f *failure) Unwrap() error { return f.cause }

func addrPort(addr netip.Addr, port int) (netip.AddrPort, error) {
	if !addr.IsValid() {
		return netip.AddrPort{}, errors.New("the instance has no address")
	}
	if port < 1 || port > 65535 {
		return netip.AddrPort{}, fmt.Errorf("port %d out of range 1-65535", port)
	}
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

// dialTCP passes when a TCP connection to addr:port is accepted; it is
// closed at once.
func dialTCP(ctx context.Context, addr netip.Addr, port int) error {
	ap, err := addrPort(addr, port)
	if err != nil {
		return err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", ap.String())
	if err != nil {
		return err
	}
	return c.Close()
}

func httpPath(h *render.HTTPCheck) string {
	if h.Path == "" {
		return "/"
	}
	return h.Path
}

// newHTTPClient is the client of the http checks: no proxy, no
// connection kept between runs, no redirect followed (a 3xx is judged as
// it is), headers bounded. Runs are bounded by their context.
func newHTTPClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                  nil,
			DialContext:            (&net.Dialer{}).DialContext,
			DisableKeepAlives:      true,
			DisableCompression:     true,
			MaxResponseHeaderBytes: maxHeaderBytes,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// get passes when GET http://addr:port<path>, with the check's Host,
// answers with a status in [StatusMin, StatusMax] (200-399 when zero).
// The body is read up to maxBody and dropped, never kept.
func (p *Prober) get(ctx context.Context, addr netip.Addr, h *render.HTTPCheck) error {
	ap, err := addrPort(addr, h.Port)
	if err != nil {
		return err
	}
	u, err := url.Parse("http://" + ap.String() + httpPath(h))
	if err != nil {
		return errors.New("the path is not a valid URL path")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	if h.Host != "" {
		req.Host = h.Host
	}
	req.Header.Set("User-Agent", "keel-health-check")
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody))
	resp.Body.Close()
	lo, hi := h.StatusMin, h.StatusMax
	if lo == 0 && hi == 0 {
		lo, hi = 200, 399
	}
	if resp.StatusCode < lo || resp.StatusCode > hi {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// execCheck passes when argv, run inside the instance, exits 0.
func (p *Prober) execCheck(ctx context.Context, name string, argv []string) error {
	if p.exec == nil {
		return errors.New("this node's driver cannot run exec checks")
	}
	if len(argv) == 0 {
		return errors.New("no command")
	}
	code, out, err := p.exec.Exec(ctx, name, argv, maxExecOutput)
	switch {
	case errors.Is(err, nodeexec.ErrNotFound):
		return errors.New("the instance does not run")
	case err != nil:
		return err
	case code != 0:
		line, _, _ := bytes.Cut(bytes.TrimSpace(out), []byte("\n"))
		if len(line) == 0 {
			return fmt.Errorf("exit status %d", code)
		}
		return fmt.Errorf("exit status %d: %s", code, cut(string(line), maxExecLine))
	}
	return nil
}

// reason is the useful part of a connection's error: "connection
// refused" rather than "dial tcp 10.0.0.5:8080: connect: connection
// refused".
func reason(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err.Error()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// bound makes a failure fit a report: printable, valid UTF-8, at most
// MaxFailure bytes.
func bound(s string) string {
	return cut(strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s), MaxFailure)
}

// cut cuts s to at most n bytes, at a UTF-8 boundary, marking the cut
// with "…".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	i := n - len(mark)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + mark
}
