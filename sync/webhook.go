package sync

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	gosync "sync"
	"time"
)

// MaxWebhookBody is the largest webhook body accepted; larger ones are
// refused unread (413).
const MaxWebhookBody = 1 << 20

// WebhookConfig configures the webhook handler.
type WebhookConfig struct {
	// Secret is the shared secret configured on the forge (from a file;
	// never logged).
	Secret []byte
	// Branch is the spec branch: a push to it triggers a fetch.
	Branch string
	// ReportPrefix returns where reports live (it follows the applied
	// commit): pushes there trigger nothing.
	ReportPrefix func() string
	// Trigger asks for a fetch now; it must not block.
	Trigger func()
	Logger  *slog.Logger
	// RefusedLogEvery is the least time between two log lines about
	// refused (unauthenticated) requests: anyone who can reach the port
	// can send them, so each interval logs one WARN with the number of
	// refusals it left out (default DefaultRefusedLogEvery).
	RefusedLogEvery time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// DefaultRefusedLogEvery is the default WebhookConfig.RefusedLogEvery.
const DefaultRefusedLogEvery = time.Minute

// refusalLog logs refused requests at most once per interval.
type refusalLog struct {
	every time.Duration
	now   func() time.Time
	log   *slog.Logger

	mu         gosync.Mutex
	last       time.Time // when the last line was logged
	suppressed int       // refusals since, not logged
}

func (l *refusalLog) refused(remote string) {
	l.mu.Lock()
	now := l.now()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	l.log.Warn("webhook refused: bad or missing signature", "remote", remote, "suppressed", n, "interval", l.every)
}

// Forge styles of webhook authentication.
const (
	forgeGitHub  = "github"  // X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>
	forgeGitea   = "gitea"   // X-Gitea-Signature / X-Forgejo-Signature: <hex HMAC-SHA256>
	forgeGitLab  = "gitlab"  // X-Gitlab-Token: the secret itself
	forgeGeneric = "generic" // X-Keel-Signature: sha256=<hex HMAC-SHA256>
)

// WebhookHandler returns the handler of push webhooks. It checks the
// signature (or token) in constant time before looking at the body, refuses
// bodies over 1 MiB, answers 401 (logged at most once per RefusedLogEvery) to anything it cannot authenticate, and
// triggers a fetch only for a push to the spec branch (or an event that
// names no ref): pushes of report refs trigger nothing.
func WebhookHandler(cfg WebhookConfig) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.RefusedLogEvery <= 0 {
		cfg.RefusedLogEvery = DefaultRefusedLogEvery
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	refusals := &refusalLog{every: cfg.RefusedLogEvery, now: cfg.Now, log: cfg.Logger}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		if r.ContentLength > MaxWebhookBody {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxWebhookBody))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "cannot read the body", http.StatusBadRequest)
			return
		}
		forge, ok := Authenticate(r.Header, body, cfg.Secret)
		if !ok {
			refusals.refused(r.RemoteAddr)
			http.Error(w, "bad or missing signature", http.StatusUnauthorized)
			return
		}
		if event := r.Header.Get("X-GitHub-Event"); event == "ping" {
			_, _ = io.WriteString(w, "pong\n")
			return
		}
		ref, err := PushRef(body)
		if err != nil {
			http.Error(w, "not a push event: "+err.Error(), http.StatusBadRequest)
			return
		}
		switch {
		case ref != "" && cfg.ReportPrefix != nil && strings.HasPrefix(ref, cfg.ReportPrefix()):
			_, _ = io.WriteString(w, "report ref: ignored\n")
		case ref != "" && cfg.Branch != "" && ref != "refs/heads/"+cfg.Branch:
			_, _ = io.WriteString(w, "other ref: ignored\n")
		default:
			cfg.Logger.Info("webhook: fetching now", "forge", forge, "ref", ref)
			cfg.Trigger()
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, "fetching\n")
		}
	})
}

// Authenticate checks a webhook's signature or token against secret, in
// constant time, and says which forge style it used.
func Authenticate(h http.Header, body, secret []byte) (string, bool) {
	if len(secret) == 0 {
		return "", false
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	sum := mac.Sum(nil)
	checkHex := func(got string) bool {
		want := make([]byte, hex.EncodedLen(len(sum)))
		hex.Encode(want, sum)
		return subtle.ConstantTimeCompare([]byte(strings.ToLower(got)), want) == 1
	}
	switch {
	case h.Get("X-Hub-Signature-256") != "":
		v, ok := strings.CutPrefix(h.Get("X-Hub-Signature-256"), "sha256=")
		return forgeGitHub, ok && checkHex(v)
	case h.Get("X-Gitea-Signature") != "":
		return forgeGitea, checkHex(h.Get("X-Gitea-Signature"))
	case h.Get("X-Forgejo-Signature") != "":
		return forgeGitea, checkHex(h.Get("X-Forgejo-Signature"))
	case h.Get("X-Gitlab-Token") != "":
		return forgeGitLab, subtle.ConstantTimeCompare([]byte(h.Get("X-Gitlab-Token")), secret) == 1
	case h.Get("X-Keel-Signature") != "":
		v, ok := strings.CutPrefix(h.Get("X-Keel-Signature"), "sha256=")
		return forgeGeneric, ok && checkHex(v)
	}
	return "", false
}

// PushRef reads the ref a push event names ("" when it names none). GitHub,
// Gitea/Forgejo and GitLab push payloads all carry it as "ref".
func PushRef(body []byte) (string, error) {
	if len(body) == 0 {
		return "", nil
	}
	var p struct {
		Ref *string `json:"ref"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return "", errors.New("the body is not JSON")
	}
	if p.Ref == nil {
		return "", nil
	}
	if !strings.HasPrefix(*p.Ref, "refs/") {
		return "refs/heads/" + *p.Ref, nil // some forges send the bare branch name
	}
	return *p.Ref, nil
}
