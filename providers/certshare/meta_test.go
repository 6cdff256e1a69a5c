package certshare_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/keel-dev/keel/providers/certshare"
)

const token = "Zx9Gm2wUqL0r5pNdT7cV3bYhK8sJ1aEfQiOoWlRnXyC"

var validMeta = `apiVersion: keel/v1
kind: SharedCertificate
host: www.example.com
publishedBy: n1
published: 2026-11-29T14:00:00Z
certificate:
  serial: beef
  notBefore: 2026-11-29T13:00:00Z
  notAfter: 2027-02-27T14:00:00Z
  issuer: Pebble Intermediate CA 7a1b
  issuedBy: n1
  bundleSHA256: ` + strings.Repeat("ab", 32) + `
  recipients:
    - node: n1
      key: SHA256:` + strings.Repeat("A", 43) + `
    - node: n2
      key: SHA256:` + strings.Repeat("B", 43) + `
challenges:
  ` + token + `: ` + token + `.` + strings.Repeat("t", 43) + `
`

func TestParseMeta(t *testing.T) {
	m, err := certshare.ParseMeta([]byte(validMeta))
	if err != nil {
		t.Fatal(err)
	}
	if m.Host != "www.example.com" || m.Certificate.Serial != "beef" || len(m.Certificate.Recipients) != 2 || len(m.Challenges) != 1 {
		t.Fatalf("parsed %+v", m)
	}
	out, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := certshare.ParseMeta(out)
	if err != nil || !reflect.DeepEqual(again, m) {
		t.Fatalf("round trip: %v\n%s", err, out)
	}
	onlyChallenges := strings.Join(append(strings.Split(validMeta, "\n")[:5], strings.Split(validMeta, "\n")[17:]...), "\n")
	if m, err := certshare.ParseMeta([]byte(onlyChallenges)); err != nil || m.Certificate != nil {
		t.Fatalf("challenges without a certificate: %v\n%s", err, onlyChallenges)
	}

	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"unknown field", "host:", "extra: 1\nhost:", "field extra not found"},
		{"second document", "kind: SharedCertificate\n", "kind: SharedCertificate\n---\n", "more than one document"},
		{"wrong kind", "kind: SharedCertificate", "kind: Report", "not a shared certificate"},
		{"uppercase host", "host: www.example.com", "host: WWW.example.com", "host:"},
		{"host climbing out", "host: www.example.com", "host: ../heads/main", "host:"},
		{"host with a slash", "host: www.example.com", "host: a/b.example.com", "host:"},
		{"empty host", "host: www.example.com", "host: ''", "host:"},
		{"host ending in .lock", "host: www.example.com", "host: www.example.lock", ".lock"},
		{"bad publisher", "publishedBy: n1", "publishedBy: ../n1", "publishedBy:"},
		{"no publication time", "published: 2026-11-29T14:00:00Z\n", "", "published: missing"},
		{"serial not hex", "serial: beef", "serial: BEEF", "serial:"},
		{"expiry before start", "notAfter: 2027-02-27T14:00:00Z", "notAfter: 2025-02-27T14:00:00Z", "notAfter:"},
		{"issuer with a newline", "issuer: Pebble Intermediate CA 7a1b", `issuer: "a\nb"`, "issuer:"},
		{"bad bundle hash", "bundleSHA256: ab", "bundleSHA256: zz", "bundleSHA256:"},
		{"recipient twice", "node: n2", "node: n1", "listed twice"},
		{"bad fingerprint", "key: SHA256:" + strings.Repeat("B", 43), "key: MD5:aa", "recipients[1].key"},
		{"token with a slash", token + ":", "../../etc/passwd:", "token"},
		{"key authorization of another token", ": " + token + ".", ": " + strings.Repeat("x", 43) + ".", "key authorization"},
		{"key authorization with a newline", token + "." + strings.Repeat("t", 43), `"` + token + "." + strings.Repeat("t", 42) + `\n"`, "key authorization"},
		{"wrong type", "serial: beef", "serial: [1]", "does not parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(validMeta, tc.old) {
				t.Fatalf("the case's text %q is not in the valid metadata", tc.old)
			}
			data := strings.Replace(validMeta, tc.old, tc.new, 1)
			_, err := certshare.ParseMeta([]byte(data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q\n%s", err, tc.want, data)
			}
		})
	}

	// Bounds: size, challenges, recipients.
	if _, err := certshare.ParseMeta([]byte(validMeta + "#" + strings.Repeat("x", certshare.MaxMetaSize))); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("oversized metadata: %v", err)
	}
	var many strings.Builder
	many.WriteString(validMeta)
	for i := range certshare.MaxChallenges {
		tok := fmt.Sprintf("%s%02d", token[:41], i)
		fmt.Fprintf(&many, "  %s: %s.%s\n", tok, tok, strings.Repeat("t", 43))
	}
	if _, err := certshare.ParseMeta([]byte(many.String())); err == nil || !strings.Contains(err.Error(), "challenges:") {
		t.Errorf("too many challenges: %v", err)
	}
}

func TestCheckHost(t *testing.T) {
	for _, h := range []string{"www.example.com", "a.b", "xn--bcher-kva.example", "a-1.example.com"} {
		if err := certshare.CheckHost(h); err != nil {
			t.Errorf("%s refused: %v", h, err)
		}
	}
	for _, h := range []string{"", "..", "a/b", "a..b", "Www.example.com", "example", "x.lock", "-a.example.com", "a.example.com.",
		"*.example.com", "a b.example.com", "refs/heads/main", "a.example.com\n", strings.Repeat("a.", 127) + "com"} {
		if err := certshare.CheckHost(h); err == nil {
			t.Errorf("%q accepted", h)
		}
	}
}

func FuzzParseMeta(f *testing.F) {
	f.Add([]byte(validMeta))
	f.Add([]byte("apiVersion: keel/v1\nkind: SharedCertificate\nhost: a.b\npublishedBy: n\npublished: 2026-01-01T00:00:00Z\n"))
	f.Add([]byte("challenges: &a {x: *a}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := certshare.ParseMeta(data)
		if err != nil {
			return
		}
		// What parses marshals, and reads back the same.
		out, err := m.Marshal()
		if err != nil {
			t.Fatalf("parsed metadata does not marshal: %v", err)
		}
		again, err := certshare.ParseMeta(out)
		if err != nil {
			t.Fatalf("marshalled metadata does not parse: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(again, m) {
			t.Fatalf("round trip changed the metadata:\n%+v\n%+v", m, again)
		}
		if err := certshare.CheckHost(m.Host); err != nil {
			t.Fatalf("host %q passed ParseMeta but not CheckHost", m.Host)
		}
	})
}
