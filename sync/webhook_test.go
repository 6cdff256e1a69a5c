package sync_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keel-dev/keel/sync"
)

const hookSecret = "It's a Secret to Everybody"

// githubBody and githubSig are GitHub's documented example: the body
// "Hello, World!" signed with the secret above gives this signature.
const (
	githubBody = "Hello, World!"
	githubSig  = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
)

func sign(body string) string {
	m := hmac.New(sha256.New, []byte(hookSecret))
	m.Write([]byte(body))
	return hex.EncodeToString(m.Sum(nil))
}

func TestGitHubDocumentedSignature(t *testing.T) {
	h := http.Header{}
	h.Set("X-Hub-Signature-256", githubSig)
	if forge, ok := sync.Authenticate(h, []byte(githubBody), []byte(hookSecret)); !ok || forge != "github" {
		t.Fatalf("GitHub's documented example refused (%s)", forge)
	}
}

func TestWebhookHandler(t *testing.T) {
	push := `{"ref":"refs/heads/main","after":"abc"}`
	report := `{"ref":"refs/keel/reports/n1"}`
	other := `{"ref":"refs/heads/feature"}`
	big := `{"ref":"refs/heads/main","pad":"` + strings.Repeat("x", sync.MaxWebhookBody) + `"}`
	flipped := []byte(push)
	flipped[3] ^= 1
	cases := []struct {
		name    string
		body    string
		headers map[string]string
		code    int
		trigger bool
	}{
		{"github push", push, map[string]string{"X-Hub-Signature-256": "sha256=" + sign(push), "X-GitHub-Event": "push"}, 202, true},
		{"github ping", `{"zen":"x"}`, map[string]string{"X-Hub-Signature-256": "sha256=" + sign(`{"zen":"x"}`), "X-GitHub-Event": "ping"}, 200, false},
		{"gitea push", push, map[string]string{"X-Gitea-Signature": sign(push)}, 202, true},
		{"forgejo push", push, map[string]string{"X-Forgejo-Signature": sign(push)}, 202, true},
		{"gitlab push", push, map[string]string{"X-Gitlab-Token": hookSecret, "X-Gitlab-Event": "Push Hook"}, 202, true},
		{"generic push", push, map[string]string{"X-Keel-Signature": "sha256=" + sign(push)}, 202, true},
		{"generic without a ref", `{}`, map[string]string{"X-Keel-Signature": "sha256=" + sign(`{}`)}, 202, true},
		{"report refs only", report, map[string]string{"X-Hub-Signature-256": "sha256=" + sign(report)}, 200, false},
		{"another branch", other, map[string]string{"X-Gitea-Signature": sign(other)}, 200, false},
		{"a flipped bit", string(flipped), map[string]string{"X-Hub-Signature-256": "sha256=" + sign(push)}, 401, false},
		{"wrong gitlab token", push, map[string]string{"X-Gitlab-Token": hookSecret + "x"}, 401, false},
		{"github without the prefix", push, map[string]string{"X-Hub-Signature-256": sign(push)}, 401, false},
		{"no signature", push, nil, 401, false},
		{"oversize", big, map[string]string{"X-Hub-Signature-256": "sha256=" + sign(big)}, 413, false},
		{"signed garbage", "not json", map[string]string{"X-Keel-Signature": "sha256=" + sign("not json")}, 400, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var triggered atomic.Int32
			h := sync.WebhookHandler(sync.WebhookConfig{Secret: []byte(hookSecret), Branch: "main",
				ReportPrefix: func() string { return "refs/keel/reports/" }, Trigger: func() { triggered.Add(1) }})
			req := httptest.NewRequest("POST", "/hook", strings.NewReader(c.body))
			for k, v := range c.headers {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != c.code {
				t.Errorf("status %d, want %d (%s)", rec.Code, c.code, rec.Body)
			}
			if got := triggered.Load() == 1; got != c.trigger {
				t.Errorf("triggered = %v, want %v", got, c.trigger)
			}
		})
	}
}

func FuzzPushRef(f *testing.F) {
	f.Add([]byte(`{"ref":"refs/heads/main"}`))
	f.Add([]byte(`{"ref":null}`))
	f.Add([]byte(`[1,2`))
	f.Fuzz(func(t *testing.T, body []byte) {
		ref, err := sync.PushRef(body)
		if err == nil && ref != "" && !strings.HasPrefix(ref, "refs/") {
			t.Fatalf("ref %q does not start with refs/", ref)
		}
	})
}

func FuzzAuthenticate(f *testing.F) {
	f.Add([]byte(githubBody), githubSig)
	f.Fuzz(func(t *testing.T, body []byte, sig string) {
		h := http.Header{}
		h.Set("X-Hub-Signature-256", sig)
		_, ok := sync.Authenticate(h, body, []byte(hookSecret))
		if ok && sig != "sha256="+sign(string(body)) && !strings.EqualFold(sig, "sha256="+sign(string(body))) {
			t.Fatalf("accepted a wrong signature %q", sig)
		}
	})
}

// TestWebhookRefusalLogLimited: anyone who reaches the port can send bad
// signatures; they must not flood the log (one WARN per interval, with the
// number left out).
func TestWebhookRefusalLogLimited(t *testing.T) {
	var buf strings.Builder
	var mu gosync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
	now := time.Unix(1_700_000_000, 0)
	var clock gosync.Mutex
	h := sync.WebhookHandler(sync.WebhookConfig{Secret: []byte(hookSecret), Branch: "main", Trigger: func() {},
		Logger: logger, RefusedLogEvery: time.Minute,
		Now: func() time.Time { clock.Lock(); defer clock.Unlock(); return now }})
	refuse := func(n int) {
		for range n {
			req := httptest.NewRequest("POST", "/hook", strings.NewReader(`{"ref":"refs/heads/main"}`))
			req.Header.Set("X-Hub-Signature-256", "sha256=00")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != 401 {
				t.Fatalf("status %d, want 401", rec.Code)
			}
		}
	}
	lines := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Split(strings.TrimSpace(buf.String()), "\n")
	}
	refuse(1000)
	if l := lines(); len(l) != 1 || !strings.Contains(l[0], "level=WARN") || !strings.Contains(l[0], "suppressed=0") {
		t.Fatalf("1000 refusals in one interval logged %d lines, want 1:\n%s", len(l), strings.Join(l, "\n"))
	}
	clock.Lock()
	now = now.Add(time.Minute)
	clock.Unlock()
	refuse(1)
	l := lines()
	if len(l) != 2 || !strings.Contains(l[1], "suppressed=999") {
		t.Fatalf("after the interval, want a second line counting 999 left out:\n%s", strings.Join(l, "\n"))
	}
}

type lockedWriter struct {
	mu *gosync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
