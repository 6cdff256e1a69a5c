// Package forge posts commit statuses to a git forge (GitHub, Gitea or
// Forgejo, GitLab): the deploy status each agent shows on the commit it
// applied or refused (docs/forge.md). It only ever writes statuses; it
// never reads the repository, and the token it holds never appears in an
// error it returns (nor, through them, in a log line or a report).
package forge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v4"
)

// Kind is a forge's API flavour.
type Kind string

// The forges whose commit status API a Client speaks.
const (
	GitHub  Kind = "github"
	Gitea   Kind = "gitea"
	Forgejo Kind = "forgejo" // Gitea's API
	GitLab  Kind = "gitlab"
)

// Kinds lists every Kind, for flag help and errors.
var Kinds = []Kind{GitHub, Gitea, Forgejo, GitLab}

// State is what a status says, in the agent's terms; each forge has its
// own word for it (GitLab: running, failed, canceled).
type State string

// The states a Client posts.
const (
	// Pending: the node is converging on the commit.
	Pending State = "pending"
	// Success: the node's share of the cluster runs at the commit.
	Success State = "success"
	// Failure: the node refused the commit.
	Failure State = "failure"
	// Error: the node stopped converging on the commit before it got there
	// (a newer commit superseded it).
	Error State = "error"
)

// Status is one commit status.
type Status struct {
	Commit string // the full hex commit hash
	State  State
	// Context tells this status from the others on the commit (keel/<node>).
	Context string
	// Description is cut to MaxDescription bytes (see Describe).
	Description string
	// TargetURL is the link the forge shows with the status ("" for none).
	TargetURL string
}

// MaxDescription is the longest description posted, in bytes: GitHub
// refuses one longer than 140 characters, and 140 bytes are never more.
const MaxDescription = 140

// DefaultGitHubAPI is GitHub's API root (GitHub Enterprise Server's is
// https://<host>/api/v3).
const DefaultGitHubAPI = "https://api.github.com"

// Config configures a Client.
type Config struct {
	Kind Kind
	// URL is the API root for GitHub (DefaultGitHubAPI when empty), the
	// forge's root URL for Gitea, Forgejo and GitLab (…/api/v1 and
	// …/api/v4 are added). https, or http to a loopback address only.
	URL string
	// Repo is owner/name; for GitLab also a numeric project ID or the
	// project's full path (group/subgroup/name).
	Repo string
	// Token is the API token. It is sent in a header, and nowhere else.
	Token string
	// HTTPClient makes the requests (its Transport is used, never its
	// redirect policy: a Client follows no redirect). Nil: a transport of
	// its own.
	HTTPClient *http.Client
	// Timeout bounds each request (default 15 s).
	Timeout time.Duration
	// RetryFor bounds the retries of one Post (default one minute):
	// network errors, 5xx and rate limits are retried, with exponential
	// backoff and jitter from RetryMin (default one second).
	RetryFor time.Duration
	RetryMin time.Duration
	// MaxRetryAfter is the longest Retry-After a rate limit may ask for
	// that a Post waits out (default one minute); a longer one ends the
	// Post with a temporary error.
	MaxRetryAfter time.Duration
}

// Client posts commit statuses. It is safe for concurrent use.
type Client struct {
	cfg  Config
	base *url.URL // the request URL up to /statuses/
	http *http.Client
}

// New checks cfg and returns a Client.
func New(cfg Config) (*Client, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 15 * time.Second
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = time.Minute
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = time.Second
	}
	if cfg.MaxRetryAfter <= 0 {
		cfg.MaxRetryAfter = time.Minute
	}
	if cfg.Kind == GitHub && cfg.URL == "" {
		cfg.URL = DefaultGitHubAPI
	}
	switch {
	case cfg.Token == "":
		return nil, errors.New("forge: no token")
	case strings.ContainsFunc(cfg.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		// A header cannot carry it (and an error would quote net/http's
		// complaint about the header).
		return nil, errors.New("forge: the token holds spaces or control characters")
	}
	u, err := checkURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	path, err := repoPath(cfg.Kind, cfg.Repo)
	if err != nil {
		return nil, err
	}
	root := strings.TrimSuffix(u.EscapedPath(), "/")
	switch cfg.Kind {
	case Gitea, Forgejo:
		root += "/api/v1"
	case GitLab:
		root += "/api/v4"
	}
	base := *u
	if base.Path, err = url.PathUnescape(root + path); err != nil {
		return nil, fmt.Errorf("forge: --forge-url: %w", err)
	}
	base.RawPath = root + path
	hc := &http.Client{Timeout: cfg.Timeout}
	if cfg.HTTPClient != nil {
		hc.Transport = cfg.HTTPClient.Transport
	}
	// A redirect would carry the token's header (PRIVATE-TOKEN is not one
	// net/http drops across hosts) to wherever it points, and turn the
	// POST into a GET: none is followed.
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Client{cfg: cfg, base: &base, http: hc}, nil
}

// checkURL parses the forge URL: https, or http to a loopback address (a
// test server, or a forge on the node itself); no credentials, query or
// fragment.
func checkURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, errors.New("forge: the URL does not parse")
	}
	switch {
	case u.User != nil:
		return nil, errors.New("forge: the URL holds credentials; the token goes in its file")
	case u.Host == "" || u.Opaque != "":
		return nil, fmt.Errorf("forge: %s: not an absolute http(s) URL", u.Redacted())
	case u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("forge: %s: a query or fragment has no place in the forge's URL", u.Redacted())
	case u.Scheme == "https":
	case u.Scheme == "http" && isLoopback(u.Hostname()):
	case u.Scheme == "http":
		return nil, fmt.Errorf("forge: %s: plain http would send the token in clear; use https (http only to a loopback address)", u.Redacted())
	default:
		return nil, fmt.Errorf("forge: %s: not an http(s) URL", u.Redacted())
	}
	return u, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

var (
	segment   = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)
	projectID = regexp.MustCompile(`^[0-9]+$`)
	hexHash   = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)
)

// repoPath is the escaped path from the API root to the repository's
// statuses, without the commit.
func repoPath(kind Kind, repo string) (string, error) {
	parts := strings.Split(repo, "/")
	for _, p := range parts {
		if !segment.MatchString(p) || p == "." || p == ".." {
			return "", fmt.Errorf("forge: repository %q: want owner/name", repo)
		}
	}
	switch kind {
	case GitHub, Gitea, Forgejo:
		if len(parts) != 2 {
			return "", fmt.Errorf("forge: repository %q: want owner/name", repo)
		}
		return "/repos/" + parts[0] + "/" + parts[1] + "/statuses/", nil
	case GitLab:
		if len(parts) == 1 && !projectID.MatchString(repo) {
			return "", fmt.Errorf("forge: project %q: want a numeric project ID or the project's path (group/name)", repo)
		}
		// The ID, or the path with its slashes escaped: GitLab's
		// "URL-encoded path of the project".
		return "/projects/" + url.PathEscape(repo) + "/statuses/", nil
	}
	return "", fmt.Errorf("forge: kind %q: want one of %s", kind, kindList())
}

func kindList() string {
	var s []string
	for _, k := range Kinds {
		s = append(s, string(k))
	}
	return strings.Join(s, ", ")
}

// ParseKind returns the Kind named s.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("forge kind %q: want one of %s", s, kindList())
}

// Describe makes s a description every forge takes: one line (every run
// of spaces and control characters one space), at most MaxDescription
// bytes, cut at a character boundary with an ellipsis.
func Describe(s string) string {
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || r == utf8.RuneError
	}), " ")
	if len(s) <= MaxDescription {
		return s
	}
	const ellipsis = "…"
	cut := MaxDescription - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.TrimRight(s[:cut], " ") + ellipsis
}

// body is the JSON a forge is sent: GitHub, Gitea and Forgejo name the
// status's label context, GitLab name.
type body struct {
	State       string `json:"state"`
	TargetURL   string `json:"target_url,omitempty"`
	Description string `json:"description,omitempty"`
	Context     string `json:"context,omitempty"`
	Name        string `json:"name,omitempty"`
}

// forgeState is s in the forge's words.
func (c *Client) forgeState(s State) (string, error) {
	switch s {
	case Pending, Success, Failure, Error:
	default:
		return "", fmt.Errorf("forge: state %q", s)
	}
	if c.cfg.Kind != GitLab {
		return string(s), nil
	}
	// GitLab's pending is "not started yet": the node converging is
	// running. An error (superseded) is canceled.
	return map[State]string{Pending: "running", Success: "success", Failure: "failed", Error: "canceled"}[s], nil
}

// Post posts st, retrying what may pass later (network errors, 5xx, rate
// limits) within RetryFor. Its errors never hold the token; Temporary
// tells those worth another try later.
func (c *Client) Post(ctx context.Context, st Status) error {
	if !hexHash.MatchString(st.Commit) {
		return fmt.Errorf("forge: commit %q is not a full hex hash", st.Commit)
	}
	if st.Context == "" || strings.ContainsFunc(st.Context, unicode.IsControl) {
		return fmt.Errorf("forge: context %q", st.Context)
	}
	state, err := c.forgeState(st.State)
	if err != nil {
		return err
	}
	b := body{State: state, TargetURL: st.TargetURL, Description: Describe(st.Description)}
	if c.cfg.Kind == GitLab {
		b.Name = st.Context
	} else {
		b.Context = st.Context
	}
	payload, err := json.Marshal(b)
	if err != nil {
		return err
	}
	u := *c.base
	u.Path += st.Commit
	u.RawPath += st.Commit
	target := u.String()

	bo := &retryAfter{ExponentialBackOff: backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(c.cfg.RetryMin), backoff.WithMaxElapsedTime(c.cfg.RetryFor))}
	var last error
	op := func() error {
		err := c.once(ctx, target, payload, state)
		last = err
		var he *HTTPError
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return backoff.Permanent(err)
		case errors.As(err, &he) && he.RetryAfter > 0:
			if he.RetryAfter > c.cfg.MaxRetryAfter {
				return backoff.Permanent(err)
			}
			bo.next = he.RetryAfter
			return err
		case Temporary(err):
			return err
		}
		return backoff.Permanent(err)
	}
	if err := backoff.Retry(op, backoff.WithContext(bo, ctx)); err != nil {
		if last != nil {
			return last
		}
		return err
	}
	return nil
}

// retryAfter is an exponential backoff whose next wait a rate limit's
// Retry-After can set.
type retryAfter struct {
	*backoff.ExponentialBackOff
	next time.Duration
}

func (r *retryAfter) NextBackOff() time.Duration {
	d := r.ExponentialBackOff.NextBackOff()
	if r.next > 0 && d != backoff.Stop {
		d, r.next = r.next, 0
	}
	return d
}

// maxErrorBody is how much of an error response is read for its message;
// maxBody how much of any response is read at all.
const (
	maxErrorBody = 8 << 10
	maxBody      = 64 << 10
)

func (c *Client) once(ctx context.Context, target string, payload []byte, state string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(payload))
	if err != nil {
		return fmt.Errorf("forge: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "keel-agent")
	switch c.cfg.Kind {
	case GitHub:
		req.Header.Set("Accept", "application/vnd.github+json")
		req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	case Gitea, Forgejo:
		req.Header.Set("Accept", "application/json")
		req.Header.Set("Authorization", "token "+c.cfg.Token)
	case GitLab:
		req.Header.Set("Accept", "application/json")
		req.Header.Set("PRIVATE-TOKEN", c.cfg.Token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// A *url.Error names the method and the URL (no credential: the
		// URL has none, the token is in a header).
		return &NetError{err: c.redact(err.Error())}
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBody)) // so the connection is reused
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	he := &HTTPError{Code: resp.StatusCode, Message: c.redact(message(data))}
	if loc := resp.Header.Get("Location"); resp.StatusCode >= 300 && resp.StatusCode < 400 && loc != "" {
		he.Message = "redirected (to " + c.redact(clip(loc)) + "): set the forge URL to where the API is"
	}
	limited := resp.StatusCode == http.StatusTooManyRequests ||
		// GitHub's secondary rate limits answer 403 with a Retry-After.
		(resp.StatusCode == http.StatusForbidden && resp.Header.Get("Retry-After") != "")
	if limited {
		he.RateLimited = true
		he.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	}
	// GitLab refuses a transition to the state a status already has
	// (running to running: a new description while converging): what the
	// Post asked for already holds.
	if c.cfg.Kind == GitLab && resp.StatusCode == http.StatusBadRequest && state == "running" &&
		strings.Contains(he.Message, "Cannot transition status via :run from :running") {
		return nil
	}
	return he
}

// redact takes the token out of s (a forge, or a proxy, that echoes a
// request back must not bring it into a log line).
func (c *Client) redact(s string) string {
	return strings.ReplaceAll(s, c.cfg.Token, "[token]")
}

// message is the forge's error message from a response body: the
// "message" of GitHub's, Gitea's and GitLab's JSON errors (GitLab's may be
// an object of field errors), else the start of the body; one line, bounded.
func message(data []byte) string {
	var e struct {
		Message json.RawMessage `json:"message"`
		Error   string          `json:"error"`
	}
	if json.Unmarshal(data, &e) == nil {
		var s string
		switch {
		case json.Unmarshal(e.Message, &s) == nil && s != "":
		case len(e.Message) > 0:
			s = string(e.Message)
		default:
			s = e.Error
		}
		return clip(s)
	}
	return clip(string(data))
}

func clip(s string) string {
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }), " ")
	if len(s) > 300 {
		cut := 300
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// parseRetryAfter reads a Retry-After header (seconds or an HTTP date);
// zero when absent or unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
		if n <= 0 {
			return 0
		}
		return time.Duration(min(n, 24*3600)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// HTTPError is a forge's refusal.
type HTTPError struct {
	Code    int
	Message string // the forge's message, one line, bounded, without the token
	// RateLimited is a 429, or a 403 with a Retry-After (GitHub's
	// secondary rate limit); RetryAfter is how long it asked to wait.
	RateLimited bool
	RetryAfter  time.Duration
}

func (e *HTTPError) Error() string {
	s := fmt.Sprintf("forge answered %d %s", e.Code, http.StatusText(e.Code))
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// NetError is a request that got no answer.
type NetError struct{ err string }

func (e *NetError) Error() string { return "forge unreachable: " + e.err }

// Temporary reports whether err may pass if the Post is tried again
// later: no answer, a 5xx, a rate limit. A 4xx (a wrong token, a missing
// repository, a refused field) needs a human.
func Temporary(err error) bool {
	var ne *NetError
	var he *HTTPError
	switch {
	case errors.As(err, &ne):
		return true
	case errors.As(err, &he):
		return he.RateLimited || he.Code >= 500
	}
	return false
}
