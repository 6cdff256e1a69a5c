package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The ingress flags: each bad combination is refused before the agent
// starts, with a message that says what to do.
func TestAgentIngressFlagErrors(t *testing.T) {
	dir := t.TempDir()
	dns := filepath.Join(dir, "dns.yaml")
	if err := os.WriteFile(dns, []byte("provider: exec\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noPEM := filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(noPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	https := []string{"--ingress-http", "127.0.0.1:0", "--ingress-https", "127.0.0.1:0"}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"a DNS provider without an ingress", []string{"--dns-provider", dns}, "--dns-provider is for an agent with an ingress"},
		{"ACME roots without an ingress", []string{"--acme-ca-roots", noPEM}, "--acme-ca-roots is for an agent with an ingress"},
		{"HTTPS without HTTP nor DNS-01", []string{"--ingress-https", "127.0.0.1:0"}, "--ingress-https needs --ingress-http"},
		{"ACME roots that are a directory", append(https, "--acme-ca-roots", dir), "is not a regular file"},
		{"ACME roots without a certificate", append(https, "--acme-ca-roots", noPEM), "holds no PEM certificate"},
		{"a DNS provider file others can read", append(https, "--dns-provider", dns), "chmod 600"},
		{"a retry under a second", append(https, "--acme-retry-min", "10ms"), "--acme-retry-min must be at least a second"},
		{"a plain-HTTP ACME directory", append(https, "--acme-directory", "http://127.0.0.1:1/dir"), "not an https URL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"agent", "--repo", t.TempDir(), "--node", "n1", "--state-dir", t.TempDir(), "--driver", "fake"}, tc.args...)
			code, _, stderr := keel(t, args...)
			if code == 0 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want a refusal with %q", code, stderr, tc.want)
			}
		})
	}
}
