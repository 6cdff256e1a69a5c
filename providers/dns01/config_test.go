package dns01

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// configErrors flattens a Load or parseConfig error into its
// *ConfigError values; any other kind fails t.
func configErrors(t testing.TB, err error) []*ConfigError {
	t.Helper()
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	var out []*ConfigError
	for _, e := range errs {
		var ce *ConfigError
		if !errors.As(e, &ce) {
			t.Fatalf("%v (%T) is not a *ConfigError", e, e)
		}
		out = append(out, ce)
	}
	return out
}

const secretInConfig = "Zm9vYmFyLXNlY3JldC1uZXZlci1zaG93bg-SECRET"

func TestParseConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, content string
		want          []string // each error's text after "dns.yaml:", in order
	}{
		{"unknown provider", "provider: route53\n",
			[]string{`1:11: provider: unknown provider "route53": want one of ovh, cloudflare, rfc2136, exec`}},
		{"missing provider", "ttl: 60\n",
			[]string{"1:1: provider: missing: want one of ovh, cloudflare, rfc2136, exec"}},
		{"missing fields", "provider: ovh\napplicationKey: " + secretInConfig + "\n",
			[]string{"1:11: applicationSecret: missing: provider ovh needs", "1:11: consumerKey: missing: provider ovh needs"}},
		{"unknown field", "provider: cloudflare\napiToken: " + secretInConfig + "\napiTokn: " + secretInConfig + "\n",
			[]string{"3:1: apiTokn: unknown field"}},
		{"another provider's field", "provider: cloudflare\napiToken: t0ken\nconsumerKey: x\n",
			[]string{"3:1: consumerKey: not a setting of provider cloudflare (it is one of ovh)"}},
		{"written twice", "provider: exec\ncommand: [/bin/true]\ncommand: [/bin/false]\n",
			[]string{"3:1: command: written twice"}},
		{"wrong type", "provider: exec\ncommand: /bin/true\n",
			[]string{"2:10: command: want a list"}},
		{"relative program", "provider: exec\ncommand: [hook.sh, present]\n",
			[]string{`2:10: command: "hook.sh": the program must be an absolute path`}},
		{"bad duration", "provider: exec\ncommand: [/bin/true]\npropagationTimeout: soon\n",
			[]string{`3:21: propagationTimeout: "soon": want a duration`}},
		{"interval past timeout", "provider: exec\ncommand: [/bin/true]\npropagationTimeout: 1s\npropagationInterval: 2s\n",
			[]string{"4:22: propagationInterval: 2s is longer than propagationTimeout (1s)"}},
		{"alias", "provider: exec\ncommand: &c [/bin/true]\nresolvers: *c\n",
			[]string{"3:12: resolvers: aliases are not allowed"}},
		{"bad base64 secret", "provider: rfc2136\nserver: 192.0.2.1\ntsigKey: k\ntsigSecret: not!base64!" + secretInConfig + "\n",
			[]string{"4:13: tsigSecret: not valid base64"}},
		{"secret of the wrong shape", "provider: cloudflare\napiToken: [" + secretInConfig + "]\n",
			[]string{"2:11: apiToken: want a single value"}},
		{"unknown TSIG algorithm", "provider: rfc2136\nserver: ns1.example.net\ntsigKey: k\ntsigSecret: c2VjcmV0\ntsigAlgorithm: hmac-md5\n",
			[]string{`5:16: tsigAlgorithm: "hmac-md5": want hmac-sha256`}},
		{"cloudflare TTL", "provider: cloudflare\napiToken: t0ken\nttl: 60\n",
			[]string{"3:6: ttl: 60: Cloudflare takes at least 120"}},
		{"resolver not an address", "provider: exec\ncommand: [/bin/true]\nresolvers: [dns.google]\n",
			[]string{`3:12: resolvers: "dns.google": want an IP address`}},
		{"env name", "provider: exec\ncommand: [/bin/true]\nenv: {\"A-B\": " + secretInConfig + "}\n",
			[]string{"3:6: env: line 3: want a variable name"}},
		{"OVH endpoint", "provider: ovh\nendpoint: ovh-mars\napplicationKey: a\napplicationSecret: b\nconsumerKey: c\n",
			[]string{`2:11: endpoint: unknown OVH endpoint "ovh-mars"`}},
		{"endpoint with credentials", "provider: cloudflare\napiToken: t\nendpoint: https://u:p@api.example/\n",
			[]string{`3:11: endpoint: "https://u:p@api.example/": want an http(s):// URL without credentials`}},
		{"not YAML", "provider: [exec\n",
			[]string{"1:1: did not find expected ',' or ']'"}},
		{"empty", "", []string{" empty: want at least provider"}},
		{"not a mapping", "- provider\n", []string{"1:1: want a mapping of settings"}},
		{"two documents", "provider: exec\ncommand: [/bin/true]\n---\nprovider: ovh\n", []string{" more than one YAML document"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig("dns.yaml", []byte(tc.content))
			if err == nil {
				t.Fatal("parsed without error")
			}
			got := configErrors(t, err)
			if len(got) != len(tc.want) {
				t.Fatalf("%d errors, want %d:\n%v", len(got), len(tc.want), err)
			}
			for i, e := range got {
				if !strings.HasPrefix(e.Error(), "dns.yaml:"+tc.want[i]) {
					t.Errorf("error %d:\n got %s\nwant dns.yaml:%s...", i, e, tc.want[i])
				}
			}
			noSecret(t, err, secretInConfig)
		})
	}
}

func TestParseConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := parseConfig("dns.yaml", []byte(`# the node's DNS provider
provider: rfc2136
server: ns1.example.net
zone: Example.NET
tsigKey: keel
tsigSecret: c2VjcmV0
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server != "ns1.example.net:53" || c.Zone != "example.net." || c.TSIGKey != "keel." || c.TSIGAlgorithm != "hmac-sha256." {
		t.Errorf("server %q zone %q key %q algorithm %q", c.Server, c.Zone, c.TSIGKey, c.TSIGAlgorithm)
	}
	if c.TTL != DefaultTTL || c.PropagationTimeout != DefaultPropagationTimeout || c.PropagationInterval != DefaultPropagationInterval || c.NameserverPort != 53 {
		t.Errorf("defaults: ttl %d timeout %s interval %s port %d", c.TTL, c.PropagationTimeout, c.PropagationInterval, c.NameserverPort)
	}
	c, err = parseConfig("dns.yaml", []byte("provider: ovh\nendpoint: ovh-ca\napplicationKey: a\napplicationSecret: b\nconsumerKey: c\npropagationTimeout: 2s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Endpoint != "https://ca.api.ovh.com/1.0" || c.PropagationInterval != 2*time.Second {
		t.Errorf("endpoint %q interval %s", c.Endpoint, c.PropagationInterval)
	}
	c, err = parseConfig("dns.yaml", []byte("provider: exec\ncommand: [/usr/local/libexec/dns-hook, --quiet]\nenv: {ZONE: example.net, API_TOKEN: t0k3n}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Timeout != DefaultExecTimeout || len(c.Env) != 2 || c.Env[1] != [2]string{"API_TOKEN", "t0k3n"} {
		t.Errorf("timeout %s env %q", c.Timeout, c.Env)
	}
	if s := c.secrets(); len(s) != 1 || s[0] != "t0k3n" {
		t.Errorf("secrets %q, want the token only (ZONE is a setting)", s)
	}
}

// The file itself: what Load refuses before parsing, and that it names
// the file.
func TestLoadFileChecks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	valid := "provider: exec\ncommand: [/bin/true]\nresolvers: [127.0.0.1]\n"
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	symlink := filepath.Join(dir, "link.yaml")
	if err := os.Symlink(write("target.yaml", valid, 0o600), symlink); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"world-readable", write("world.yaml", valid, 0o644), "world.yaml: mode 0644 lets other users read or change the DNS credentials; chmod 600 it"},
		{"group-readable", write("group.yaml", valid, 0o640), "group.yaml: mode 0640 lets other users"},
		{"oversized", write("big.yaml", valid+"#"+strings.Repeat("x", MaxConfigSize)+"\n", 0o600), "bytes, more than the 65536 a DNS provider configuration may have"},
		{"directory", dir, dir + ": not a regular file (d"},
		{"FIFO", fifo, "fifo: not a regular file (p"},
		{"missing", filepath.Join(dir, "none.yaml"), "none.yaml: no such file or directory"},
		{"parse error", write("bad.yaml", "provider: exec\n", 0o600), "bad.yaml:1:11: command: missing"},
		{"symlink to a good file", symlink, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.path)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v, want %q", err, tc.want)
			}
		})
	}
	t.Run("unreadable", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root reads a mode 0000 file")
		}
		_, err := Load(write("unreadable.yaml", valid, 0o000))
		if err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Fatalf("Load = %v, want permission denied", err)
		}
	})
}

// FuzzParseConfig: the parser never panics; what it accepts is complete;
// what it refuses is a list of *ConfigError that never quotes a value of
// a credential field.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		"provider: ovh\nendpoint: ovh-eu\napplicationKey: a\napplicationSecret: b\nconsumerKey: c\n",
		"provider: cloudflare\napiToken: " + secretInConfig + "\nendpoint: http://127.0.0.1:1/x\nttl: 300\n",
		"provider: rfc2136\nserver: '[::1]:5353'\nzone: example.net\ntsigKey: k\ntsigAlgorithm: hmac-sha512\ntsigSecret: c2VjcmV0\n",
		"provider: exec\ncommand: [/bin/hook, a]\ntimeout: 10s\nenv: {A: b}\nerrorOutput: true\nresolvers: [127.0.0.1:53, '::1']\nnameserverPort: 5353\n",
		"provider: &a exec\ncommand: *a\n",
		"provider: rfc2136\ntsigSecret: {x: " + secretInConfig + "}\n",
		"<<: {provider: exec}\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseConfig("f.yaml", data)
		if err == nil {
			if c.TTL < 1 || c.PropagationInterval <= 0 || c.PropagationInterval > c.PropagationTimeout || c.NameserverPort < 1 {
				t.Fatalf("accepted with bad common settings: %+v", c)
			}
			ok := map[string]bool{
				ProviderOVH:        c.ApplicationKey != "" && c.ApplicationSecret != "" && c.ConsumerKey != "" && c.Endpoint != "",
				ProviderCloudflare: c.APIToken != "" && c.TTL >= 120,
				ProviderRFC2136:    c.Server != "" && c.TSIGKey != "" && c.TSIGSecret != "" && c.TSIGAlgorithm != "",
				ProviderExec:       len(c.Command) > 0 && strings.HasPrefix(c.Command[0], "/") && c.Timeout > 0,
			}[c.Provider]
			if !ok {
				t.Fatalf("accepted an incomplete %q configuration: %+v", c.Provider, c)
			}
			return
		}
		for _, e := range configErrors(t, err) {
			if e.File != "f.yaml" || e.Line < 0 || e.Msg == "" {
				t.Fatalf("malformed error %#v", e)
			}
		}
		// Put a marker in every scalar under a credential field, parse
		// again: the marker must not be in the errors.
		var doc yaml.Node
		if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
			return
		}
		const marker = "MARKER-0f1e2d3c"
		root, marked := doc.Content[0], false
		for i := 0; i+1 < len(root.Content); i += 2 {
			switch root.Content[i].Value {
			case "applicationKey", "applicationSecret", "consumerKey", "apiToken", "tsigSecret":
				var walk func(n *yaml.Node)
				walk = func(n *yaml.Node) {
					if n.Kind == yaml.ScalarNode {
						n.Value, n.Tag, n.Style, marked = marker, "!!str", 0, true
					}
					for _, c := range n.Content {
						walk(c)
					}
				}
				walk(root.Content[i+1])
			}
		}
		if !marked {
			return
		}
		again, merr := yaml.Marshal(&doc)
		if merr != nil {
			return
		}
		if _, err := parseConfig("f.yaml", again); err != nil && strings.Contains(err.Error(), marker) {
			t.Fatalf("an error quotes a credential value:\n%s\n%v", again, err)
		}
	})
}
