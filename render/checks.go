package render

// Health checks, terminationGracePeriod and rollout strategies: how they
// are read, checked and resolved (docs/spec.md, "Health checks" and
// "Rollouts").

import (
	"cmp"
	"fmt"
	"net/netip"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Defaults of a health check, of terminationGracePeriod and of a Service's
// strategy, as documented in docs/spec.md.
const (
	DefaultCheckPeriod            = Duration(5 * time.Second)
	DefaultCheckTimeout           = Duration(time.Second)
	DefaultSuccessThreshold       = 1
	DefaultFailureThreshold       = 3
	DefaultHTTPCheckPath          = "/"
	DefaultStatusMin              = 200
	DefaultStatusMax              = 399
	DefaultTerminationGracePeriod = Duration(10 * time.Second)
	DefaultMaxUnavailable         = 1
	DefaultProgressDeadline       = Duration(10 * time.Minute)
)

// Bounds of the same fields.
const (
	maxCheckPeriod            = Duration(time.Hour)
	maxThreshold              = 100
	maxHTTPCheckPath          = 1024
	maxTerminationGracePeriod = Duration(time.Hour)
	maxMinReadySeconds        = 3600
)

var failureActions = []string{FailurePause, FailureContinue}

// resolveChecks validates a spec's checks (field is "spec.checks" or
// "spec.template.checks") and returns them with defaults applied. svc is
// the Service of a template, nil for a Jail: a Service's replica without
// a readiness check gets one on the Service's port.
func (r *renderer) resolveChecks(in checksInput, field string, at func(string) Position, svc *Service) Checks {
	c := Checks{
		Startup:   r.resolveCheck(in.Startup, field, "startup", at, svc),
		Readiness: r.resolveCheck(in.Readiness, field, "readiness", at, svc),
		Liveness:  r.resolveCheck(in.Liveness, field, "liveness", at, svc),
	}
	if svc != nil {
		def := defaultReadiness(svc.Port)
		switch {
		case c.Readiness == nil:
			c.Readiness = def
		case sameCheck(*c.Readiness, *def):
			// The default written out is the default: it hashes as one.
			c.Readiness.Default = true
		}
	}
	return c
}

// sameCheck reports whether two checks check the same, whichever was
// written and whichever render added.
func sameCheck(a, b Check) bool {
	a.Default, b.Default = false, false
	return reflect.DeepEqual(a, b)
}

// defaultReadiness is the readiness check of a Service's replica whose
// template has none: the Service's port accepts a TCP connection.
func defaultReadiness(port int) *Check {
	return &Check{
		TCP:              &TCPCheck{Port: port},
		Period:           DefaultCheckPeriod,
		Timeout:          DefaultCheckTimeout,
		SuccessThreshold: DefaultSuccessThreshold,
		FailureThreshold: DefaultFailureThreshold,
		Default:          true,
	}
}

// resolveCheck validates the check of the given kind (startup, readiness
// or liveness) in checks. It returns nil only when the check is not
// written: one written with errors is returned as far as it resolves, so
// that no default stands in for it.
func (r *renderer) resolveCheck(in *checkInput, checks, kind string, at func(string) Position, svc *Service) *Check {
	if in == nil {
		return nil
	}
	field := checks + "." + kind
	errorf := func(sub, format string, args ...any) {
		p := join(field, sub)
		r.diag.errorf(at(p), p, format, args...)
	}
	c := &Check{
		Period:           cmp.Or(in.Period, DefaultCheckPeriod),
		SuccessThreshold: cmp.Or(in.SuccessThreshold, DefaultSuccessThreshold),
		FailureThreshold: cmp.Or(in.FailureThreshold, DefaultFailureThreshold),
	}
	// A period shorter than the default timeout brings the timeout down
	// with it, rather than an error about a field the user did not write.
	c.Timeout = cmp.Or(in.Timeout, min(DefaultCheckTimeout, c.Period))

	var probes []string
	if t := in.TCP; t != nil {
		probes = append(probes, "tcp")
		c.TCP = &TCPCheck{Port: r.checkPort(t.Port, field+".tcp.port", at, svc)}
	}
	if h := in.HTTP; h != nil {
		probes = append(probes, "http")
		c.HTTP = &HTTPCheck{
			Port:      r.checkPort(h.Port, field+".http.port", at, svc),
			Path:      cmp.Or(h.Path, DefaultHTTPCheckPath),
			Host:      h.Host,
			StatusMin: cmp.Or(h.Status.Min, DefaultStatusMin),
			StatusMax: cmp.Or(h.Status.Max, DefaultStatusMax),
		}
		if h.Path != "" {
			if msg := checkHTTPPath(h.Path); msg != "" {
				errorf("http.path", "%s", msg)
			}
		}
		if h.Host != "" {
			if msg := checkHTTPHost(h.Host); msg != "" {
				errorf("http.host", "%s", msg)
			}
		}
	}
	if e := in.Exec; e != nil {
		probes = append(probes, "exec")
		c.Exec = &ExecCheck{Command: e.Command}
		if len(e.Command) == 0 {
			errorf("exec.command", "required: the command to run inside the instance, as a list (argv), e.g. [/usr/local/bin/healthcheck]")
		}
		r.checkArgv(e.Command, join(field, "exec.command"), at)
	}
	switch len(probes) {
	case 0:
		r.diag.errorf(at(field), field, "a check needs one of tcp, http or exec")
	case 1:
	case 2:
		r.diag.errorf(at(field), field, "%s and %s are both set: a check has exactly one of tcp, http or exec", probes[0], probes[1])
	default:
		r.diag.errorf(at(field), field, "tcp, http and exec are all set: a check has exactly one of them")
	}

	if c.Period > maxCheckPeriod {
		errorf("period", "%s is more than %s: a check runs at least once an hour", c.Period, maxCheckPeriod)
	}
	if c.Timeout > c.Period {
		errorf("timeout", "%s is longer than the period, %s: a run must end before the next one starts", c.Timeout, c.Period)
	}
	switch n := c.SuccessThreshold; {
	case n < 1 || n > maxThreshold:
		errorf("successThreshold", "%d is not a threshold (1-%d)", n, maxThreshold)
	case n != 1 && kind != "readiness":
		errorf("successThreshold", "%d: must be 1 for a %s check, as in Kubernetes (only a readiness check counts passes in a row)", n, kind)
	}
	if n := c.FailureThreshold; n < 1 || n > maxThreshold {
		errorf("failureThreshold", "%d is not a threshold (1-%d)", n, maxThreshold)
	}
	return c
}

// checkPort returns a check's port: as written, or the Service's port when
// a template leaves it out. A Jail has no port to default to.
func (r *renderer) checkPort(port *int, field string, at func(string) Position, svc *Service) int {
	switch {
	case port == nil && svc != nil:
		return svc.Port
	case port == nil:
		r.diag.errorf(at(field), field, "required: the port to check (only a Service's template defaults it, to the Service's port)")
		return 0
	case *port < 1 || *port > 65535:
		r.diag.errorf(at(field), field, "%d is not a TCP port (1-65535)", *port)
	}
	return *port
}

// checkArgv reports an argv whose program is empty or with a NUL byte in
// any argument (a spec's command, an exec check's).
func (r *renderer) checkArgv(argv []string, field string, at func(string) Position) {
	for i, arg := range argv {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case i == 0 && arg == "":
			r.diag.errorf(at(f), f, "the program to run must not be empty")
		case strings.ContainsRune(arg, 0):
			r.diag.errorf(at(f), f, "contains a NUL byte")
		}
	}
}

// checkHTTPPath validates an http check's path: what follows the port in
// the URL the check gets, query included.
func checkHTTPPath(p string) string {
	switch {
	case len(p) > maxHTTPCheckPath:
		return fmt.Sprintf("is %d bytes long, more than %d", len(p), maxHTTPCheckPath)
	case !strings.HasPrefix(p, "/"):
		return fmt.Sprintf("%q is not a URL path (want one starting with /, e.g. /healthz)", p)
	case strings.ContainsFunc(p, func(c rune) bool { return unicode.IsControl(c) || unicode.IsSpace(c) }):
		return fmt.Sprintf("%q contains a space or a control character (percent-encode it, e.g. %%20)", p)
	case strings.Contains(p, "#"):
		return fmt.Sprintf("%q has a fragment (#...), which is never sent to the server", p)
	}
	if _, err := url.ParseRequestURI(p); err != nil {
		return fmt.Sprintf("%q is not a URL path (a %% must start an escape such as %%2F)", p)
	}
	return ""
}

// checkHTTPHost validates an http check's host header: a DNS name or an
// IPv4 address, with neither a scheme nor a port.
func checkHTTPHost(h string) string {
	if a, err := netip.ParseAddr(h); err == nil {
		if !a.Is4() {
			return fmt.Sprintf("%q: only IPv4 addresses are supported", h)
		}
		return ""
	}
	switch {
	case strings.Contains(h, "://"):
		return fmt.Sprintf("%q: want a host name without a scheme, e.g. app.example.com", h)
	case strings.Contains(h, "/"):
		return fmt.Sprintf("%q: want a host name without a path (the path is http.path)", h)
	case strings.Contains(h, ":"):
		return fmt.Sprintf("%q: want a host name without a port (the port is http.port)", h)
	}
	return checkHostname(h, false)
}

// statusRange is an http check's expected status as written: one code
// ("204", or 204 unquoted) or a range ("200-399"), 100-599.
type statusRange struct{ Min, Max int }

func (s *statusRange) parseScalar(text string) error {
	t := strings.TrimSpace(text)
	lo, hi, isRange := strings.Cut(t, "-")
	if !isRange {
		hi = lo
	}
	a, okA := statusCode(lo)
	b, okB := statusCode(hi)
	switch {
	case !okA || !okB:
		return fmt.Errorf("%q is not an HTTP status or range of statuses (want e.g. 200, or 200-399)", text)
	case a < 100 || a > 599 || b < 100 || b > 599:
		return fmt.Errorf("%q: an HTTP status is from 100 to 599", text)
	case a > b:
		return fmt.Errorf("%q is an empty range: %d is more than %d", text, a, b)
	}
	s.Min, s.Max = a, b
	return nil
}

// statusCode parses digits only: no sign, no spaces.
func statusCode(s string) (int, bool) {
	if s == "" || len(s) > 3 || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// intOrPercent is a strategy's maxUnavailable or maxSurge as written: a
// number of replicas (0-10000), or a percentage of them ("25%", 0-100).
type intOrPercent struct {
	N       int
	Percent bool
}

func (v *intOrPercent) parseScalar(text string) error {
	t := strings.TrimSpace(text)
	digits, pct := strings.CutSuffix(t, "%")
	n, err := strconv.Atoi(digits)
	switch {
	case err != nil || digits == "" || digits[0] == '+':
		return fmt.Errorf("%q is not a number of replicas or a percentage of them (want e.g. 1 or 25%%)", text)
	case n < 0:
		return fmt.Errorf("%q must not be negative", text)
	case pct && n > 100:
		return fmt.Errorf("%q is more than 100%%", text)
	case !pct && n > maxReplicas:
		return fmt.Errorf("%q is more than %d replicas", text, maxReplicas)
	}
	v.N, v.Percent = n, pct
	return nil
}

// resolve returns the number v stands for among replicas: a percentage
// rounded up or down.
func (v intOrPercent) resolve(replicas int, roundUp bool) int {
	if !v.Percent {
		return v.N
	}
	if roundUp {
		return (v.N*replicas + 99) / 100
	}
	return v.N * replicas / 100
}

// strategyCounts resolves a strategy's maxUnavailable and maxSurge
// against the replicas, as Kubernetes does: maxUnavailable rounded down,
// maxSurge rounded up, and when both come to 0, maxUnavailable is 1. A
// stateful Service, or one of no replicas, never surges. It reports
// nothing, so that the instance cap can count surge instances before
// anything is expanded (see overCap); resolveStrategy reports.
func strategyCounts(in strategyInput, replicas int, stateful bool) (maxUnavailable, maxSurge int) {
	maxUnavailable = DefaultMaxUnavailable
	if in.MaxUnavailable != nil {
		maxUnavailable = in.MaxUnavailable.resolve(replicas, false)
	}
	if in.MaxSurge != nil && !stateful && replicas > 0 {
		maxSurge = in.MaxSurge.resolve(replicas, true)
	}
	if maxUnavailable == 0 && maxSurge == 0 {
		maxUnavailable = 1
	}
	return maxUnavailable, maxSurge
}

// surgeInstances is the number of surge instances d declares.
func surgeInstances(d doc[serviceDoc]) int {
	_, n := strategyCounts(d.v.Spec.Strategy, replicas(d), len(d.v.Spec.Template.Volumes) > 0)
	return n
}

// resolveStrategy validates a Service's spec.strategy and returns it with
// defaults applied and percentages resolved against replicas.
func (r *renderer) resolveStrategy(in strategyInput, replicas int, stateful bool, at func(string) Position) Strategy {
	errorf := func(sub, format string, args ...any) {
		p := "spec.strategy." + sub
		r.diag.errorf(at(p), p, format, args...)
	}
	s := Strategy{
		MinReadySeconds:  in.MinReadySeconds,
		ProgressDeadline: cmp.Or(in.ProgressDeadline, DefaultProgressDeadline),
		FailureAction:    cmp.Or(in.FailureAction, FailurePause),
	}
	s.MaxUnavailable, s.MaxSurge = strategyCounts(in, replicas, stateful)
	if mu, ms := in.MaxUnavailable, in.MaxSurge; mu != nil && ms != nil && mu.N == 0 && ms.N == 0 {
		errorf("maxUnavailable", "maxUnavailable and maxSurge are both 0: a rollout could never replace a replica (make one of them more than 0)")
	}
	if stateful && in.MaxSurge != nil && in.MaxSurge.N > 0 {
		errorf("maxSurge", "must be 0 for a stateful Service (one with volumes): a stateful replica never surges, since its volumes are its own and held by one instance at a time")
	}
	if n := s.MinReadySeconds; n < 0 || n > maxMinReadySeconds {
		errorf("minReadySeconds", "%d is not a number of seconds from 0 to %d", n, maxMinReadySeconds)
	} else if ready := Duration(time.Duration(n) * time.Second); s.ProgressDeadline <= ready {
		errorf("progressDeadline", "%s is not more than minReadySeconds (%s): no replica could become available in time", s.ProgressDeadline, ready)
	}
	if !slices.Contains(failureActions, s.FailureAction) {
		msg := fmt.Sprintf("%q is not a failure action (want pause or continue)", s.FailureAction)
		if sug := suggest(s.FailureAction, failureActions); sug != "" {
			msg = fmt.Sprintf("%q is not a failure action (did you mean %q?)", s.FailureAction, sug)
		}
		errorf("failureAction", "%s", msg)
	}
	return s
}

// resolveGracePeriod returns a spec's terminationGracePeriod, checked.
func (r *renderer) resolveGracePeriod(in Duration, field string, at func(string) Position) Duration {
	if in > maxTerminationGracePeriod {
		r.diag.errorf(at(field), field, "%s is more than %s", in, maxTerminationGracePeriod)
	}
	return cmp.Or(in, DefaultTerminationGracePeriod)
}
