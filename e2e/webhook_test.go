//go:build linux

package e2e

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// TestWebhook: agents that poll only once a minute deploy a push at once
// when the forge's signed webhook arrives; a forged one is refused.
func TestWebhook(t *testing.T) {
	t.Parallel()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	secret := "a webhook secret for the test"
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Each agent binds a port of its choosing and records it.
	c := newCluster(t, 3*time.Minute, localcluster.Options{
		Poll:      time.Minute,
		AgentArgs: []string{"--no-watch", "--webhook-listen", "127.0.0.1:0", "--webhook-secret-file", secretFile},
		Files:     map[string]string{"apps/web.yaml": webService(2, "base/demo", "hello")},
	})
	hooks := map[string]string{}
	for _, n := range c.Nodes {
		addr, err := c.ListenAddr(c.ctx, n, "webhook")
		if err != nil {
			t.Fatal(err)
		}
		hooks[n] = addr
	}
	c.converge("first commit (fetched at start)")
	tip := c.commit("scale web", map[string]string{"apps/web.yaml": webService(4, "base/demo", "hello")})
	body := []byte(fmt.Sprintf(`{"ref":"refs/heads/main","after":%q}`, tip))
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	send := func(node, sig string) int {
		req, _ := http.NewRequest("POST", "http://"+hooks[node]+"/hook", bytes.NewReader(body))
		req.Header.Set("X-Hub-Signature-256", sig)
		req.Header.Set("X-GitHub-Event", "push")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, n := range c.Nodes {
		if code := send(n, "sha256="+hex.EncodeToString(make([]byte, 32))); code != http.StatusUnauthorized {
			t.Fatalf("%s: a forged webhook got %d", n, code)
		}
	}
	start := time.Now()
	for _, n := range c.Nodes {
		if code := send(n, "sha256="+hex.EncodeToString(mac.Sum(nil))); code != http.StatusAccepted {
			t.Fatalf("%s: a signed webhook got %d", n, code)
		}
	}
	c.converge("the push, fetched on the webhook")
	if took := time.Since(start); took > 45*time.Second {
		t.Errorf("converged in %s: the webhook did not trigger a fetch (the poll is 1 minute)", took)
	}
}
