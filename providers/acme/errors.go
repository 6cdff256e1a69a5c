package acme

import (
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/acme"
)

// Error is the CA's refusal of a step of an order, cut down to what an
// operator acts on: the problem type, the CA's detail and when the CA
// allows another try. It holds no URL of the account or the order.
type Error struct {
	Op     string // the step: "new order", "http-01 validation of example.com", ...
	Status int    // the HTTP status, when the CA answered with an error
	// Type is the problem type without its "urn:ietf:params:acme:error:"
	// prefix: "rateLimited", "unauthorized", "dns", "connection", ...
	Type   string
	Detail string // the CA's explanation, at most maxDetail bytes
	// RetryAfter is how long the CA asked to wait (Retry-After), zero if
	// it did not.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	s := "acme: " + e.Op + ": " + e.Type
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(" (retry after %s)", e.RetryAfter.Round(time.Second))
	}
	return s
}

const maxDetail = 300

// caError turns an error of x/crypto/acme into an *Error when the CA
// stated a problem, or wraps it with op otherwise (a network error, a
// context done).
func caError(op string, err error) error {
	var (
		ae *acme.Error
		oe *acme.OrderError
		ze *acme.AuthorizationError
	)
	switch {
	case errors.As(err, &oe) && oe.Problem != nil:
		ae = oe.Problem
	case errors.As(err, &oe):
		return &Error{Op: op, Type: "order" + capitalize(oe.Status)}
	case errors.As(err, &ze):
		// The first problem is the authorization's or its challenge's;
		// either says why validation failed.
		for _, e := range ze.Errors {
			if errors.As(e, &ae) {
				break
			}
		}
		if ae == nil {
			return &Error{Op: op, Type: "unauthorized", Detail: "the authorization is invalid"}
		}
	case errors.As(err, &ae):
	default:
		return fmt.Errorf("acme: %s: %w", op, err)
	}
	e := &Error{
		Op:     op,
		Status: ae.StatusCode,
		Type:   strings.TrimPrefix(strings.TrimPrefix(ae.ProblemType, "urn:ietf:params:acme:error:"), "urn:acme:error:"),
		Detail: ae.Detail,
	}
	if e.Type == "" {
		e.Type = http.StatusText(ae.StatusCode)
	}
	if len(e.Detail) > maxDetail {
		e.Detail = e.Detail[:maxDetail] + "…"
	}
	if d, ok := acme.RateLimit(ae); ok && d > 0 {
		e.RetryAfter = d
	} else if ae.Header != nil {
		e.RetryAfter = retryAfter(ae.Header.Get("Retry-After"), time.Now())
	}
	return e
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// retryAfter parses a Retry-After value, seconds or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// Retries of one request within an order (x/crypto/acme asks
// retryBackoff): a bad nonce is retried at once with a fresh one (the CA
// may reject any nonce, Pebble a set share of them); 429 and 5xx after
// the CA's Retry-After if short, else with a short exponential backoff.
// A longer Retry-After ends the order: Error.RetryAfter carries it to the
// Manager, which waits it out.
const (
	maxNonceRetries = 10
	maxRetries      = 4
	maxInlineWait   = 30 * time.Second
)

func retryBackoff(n int, _ *http.Request, res *http.Response) time.Duration {
	jitter := func(max time.Duration) time.Duration {
		j, err := rand.Int(rand.Reader, big.NewInt(int64(max)))
		if err != nil {
			return 0
		}
		return time.Duration(j.Int64())
	}
	if res.StatusCode == http.StatusBadRequest {
		// x/crypto/acme retries a 400 only for badNonce.
		if n > maxNonceRetries {
			return 0
		}
		return time.Duration(n)*10*time.Millisecond + jitter(10*time.Millisecond)
	}
	if n > maxRetries {
		return 0
	}
	if d := retryAfter(res.Header.Get("Retry-After"), time.Now()); d > 0 {
		if d > maxInlineWait {
			return 0
		}
		return d + jitter(time.Second)
	}
	return time.Duration(1<<(n-1))*time.Second + jitter(time.Second)
}
