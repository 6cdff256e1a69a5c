package sync_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/providers"
	"github.com/keel-dev/keel/providers/certshare"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

var certTime = time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)

// certBundle makes a self-signed certificate for host with a fresh ECDSA
// P-256 key, and returns the key too.
func certBundle(t *testing.T, host string) (*providers.Bundle, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(0xbeef), Subject: pkix.Name{CommonName: host}, Issuer: pkix.Name{CommonName: "test CA"},
		DNSNames: []string{host}, NotBefore: certTime.Add(-time.Hour), NotAfter: certTime.Add(90 * 24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := providers.EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := providers.ParseBundle(host, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return b, key
}

// certNode is a node's report key: its signer, its public key and the
// identity that opens what is sealed to it.
type certNode struct {
	name   string
	signer ssh.Signer
	pub    ssh.PublicKey
	line   string
	id     *certshare.Identity
}

func newCertNode(t *testing.T, dir, name string) certNode {
	t.Helper()
	file, line := sshKey(t, dir, name)
	signer, err := sync.LoadReportSigner(file)
	if err != nil {
		t.Fatal(err)
	}
	id, err := certshare.LoadIdentity(file)
	if err != nil {
		t.Fatal(err)
	}
	return certNode{name: name, signer: signer, pub: signer.PublicKey(), line: line, id: id}
}

func (n certNode) recipient() certshare.Recipient {
	return certshare.Recipient{Node: n.name, Key: n.line}
}

// TestCertsPublishFetchPrune: a certificate published by one node's mirror
// is fetched by another's, verified and opened with its key; its ref has no
// history; publishing it does not touch the report refs, nor publishing a
// report the certificate ref; a certificate ref deleted on the remote is
// deleted by the next fetch.
func TestCertsPublishFetchPrune(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	n1, n2 := newCertNode(t, dir, "n1"), newCertNode(t, dir, "n2")
	keys := sync.ReportKeys{"n1": n1.pub, "n2": n2.pub}
	bare, _ := server(t)
	prefix := render.DefaultReportRefPrefix
	m1, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "repo"), sync.Remote{URL: bare, Branch: "main"}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "repo"), sync.Remote{URL: bare, Branch: "main"}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	r := report.Report{Node: "n1", Time: certTime, AgentVersion: "test"}
	if _, err := m1.Publish(ctx, "n1", r.Marshal(), r.Time); err != nil {
		t.Fatal(err)
	}
	reportRef := prefix + "n1"
	certRef := sync.CertRefPrefix + "www.example.com"
	reportAt := git(t, bare, "", "rev-parse", reportRef)

	b, _ := certBundle(t, "www.example.com")
	s, err := certshare.Seal(b, "n1", []certshare.Recipient{n1.recipient(), n2.recipient()}, certTime)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m1.PublishCert(ctx, s, n1.signer, certTime); err != nil {
		t.Fatal(err)
	}
	if got := git(t, bare, "", "rev-parse", reportRef); got != reportAt {
		t.Errorf("publishing a certificate moved the report ref")
	}
	if n := git(t, bare, "", "rev-list", "--count", certRef); n != "1" {
		t.Errorf("the certificate ref has %s commits, want 1", n)
	}
	if files := git(t, bare, "", "ls-tree", "--name-only", certRef); files != "bundle.age\ncert.yaml\ncert.yaml.sig" {
		t.Errorf("the certificate commit holds %q", files)
	}
	certAt := git(t, bare, "", "rev-parse", certRef)
	r.AgentVersion = "test2"
	if _, err := m1.Publish(ctx, "n1", r.Marshal(), r.Time); err != nil {
		t.Fatal(err)
	}
	if got := git(t, bare, "", "rev-parse", certRef); got != certAt {
		t.Errorf("publishing a report moved the certificate ref")
	}

	refs, err := m2.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if refs.Certs["www.example.com"].String() != certAt || refs.Reports["n1"].String() != git(t, bare, "", "rev-parse", reportRef) {
		t.Fatalf("fetched refs %+v", refs)
	}
	certs, problems, err := m2.Certs([]string{"n1", "n2"}, keys)
	if err != nil || len(problems) != 0 {
		t.Fatalf("read certificates: %v %q", err, problems)
	}
	c, ok := certs["www.example.com"]
	if !ok || !c.Signed || c.Commit.String() != certAt || c.Ref.String() != certRef {
		t.Fatalf("certificates %+v", certs)
	}
	opened, err := certshare.Open(c.Sealed, n2.id)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(opened.KeyPEM, b.KeyPEM) || opened.Serial != "beef" {
		t.Error("the opened certificate is not the one published")
	}
	reports, _, err := m2.Reports(nil)
	if err != nil || len(reports) != 1 || reports[0].AgentVersion != "test2" {
		t.Errorf("reports next to a certificate: %v %v", reports, err)
	}

	// A challenge published over the certificate replaces the commit;
	// the fetch sees the change.
	token := strings.Repeat("T", 43)
	s2, err := s.Republish("n2", map[string]string{token: token + "." + strings.Repeat("k", 43)}, certTime.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m1.PublishCert(ctx, s2, n2.signer, certTime.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	refs2, err := m2.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if refs2.Equal(refs) {
		t.Error("a new certificate commit left the fetched refs equal")
	}
	certs, problems, _ = m2.Certs([]string{"n1", "n2"}, keys)
	if c := certs["www.example.com"]; len(problems) != 0 || c.Meta.PublishedBy != "n2" || len(c.Meta.Challenges) != 1 {
		t.Fatalf("republished certificate %+v %q", c.Meta, problems)
	}

	// Deleted on the remote: deleted here by the next fetch, reports kept.
	git(t, bare, "", "update-ref", "-d", certRef)
	refs, err = m2.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := refs.Certs["www.example.com"]; ok || len(refs.Reports) != 1 {
		t.Errorf("after the remote deleted the certificate ref: %+v", refs)
	}
	if certs, _, _ := m2.Certs([]string{"n1", "n2"}, keys); len(certs) != 0 {
		t.Errorf("a deleted certificate is still read: %v", certs)
	}
}

// TestSharedCertKeyNeverInRepo: whoever reads the repository without a
// node key learns nothing of the private key: no object of the remote or
// of the publishing mirror holds it, in PEM, DER, base64 or as its scalar
// (every object is inflated and scanned).
func TestSharedCertKeyNeverInRepo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n1 := newCertNode(t, t.TempDir(), "n1")
	bare, _ := server(t)
	mirrorDir := filepath.Join(t.TempDir(), "repo")
	m, err := sync.OpenMirror(ctx, mirrorDir, sync.Remote{URL: bare, Branch: "main"}, render.DefaultReportRefPrefix)
	if err != nil {
		t.Fatal(err)
	}
	b, key := certBundle(t, "www.example.com")
	s, err := certshare.Seal(b, "n1", []certshare.Recipient{n1.recipient()}, certTime)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.PublishCert(ctx, s, n1.signer, certTime); err != nil {
		t.Fatal(err)
	}
	// Packed as well as loose objects are read.
	git(t, bare, "", "repack", "-a", "-q")
	block, _ := pem.Decode(b.KeyPEM)
	d, err := key.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string][]byte{
		"PEM": b.KeyPEM, "DER": block.Bytes, "base64": []byte(base64.StdEncoding.EncodeToString(block.Bytes)),
		"a PEM line": []byte(strings.Split(string(b.KeyPEM), "\n")[1]), "scalar": d, "hex scalar": []byte(hex.EncodeToString(d)),
	}
	for _, repo := range []string{bare, mirrorDir} {
		cmd := exec.Command("git", "cat-file", "--batch-all-objects", "--batch")
		cmd.Dir = repo
		cmd.Env = append(cmd.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		all, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		// The scan sees the published objects: the public metadata is there.
		if !bytes.Contains(all, []byte("host: www.example.com")) || !bytes.Contains(all, []byte("age-encryption.org/v1")) {
			t.Fatalf("%s: the scan did not see the certificate's objects", repo)
		}
		for what, secret := range secrets {
			if bytes.Contains(all, secret) {
				t.Errorf("%s: an object holds the private key (%s)", repo, what)
			}
		}
	}
}

// TestReadCertsRefuses: each certificate ref that is tampered with,
// signed by the wrong key, published by a node that may not, oversized,
// or out of the ref namespace is skipped with a problem naming it; the
// good ones are read.
func TestReadCertsRefuses(t *testing.T) {
	keyDir := t.TempDir()
	n1, n2, n9 := newCertNode(t, keyDir, "n1"), newCertNode(t, keyDir, "n2"), newCertNode(t, keyDir, "n9")
	keys := sync.ReportKeys{"n1": n1.pub, "n2": n2.pub, "n9": n9.pub}
	publishers := []string{"n1", "n2", "n3"} // n3 has no report key; n9 is no ingress node
	dir := commitTree(t, map[string]string{"cluster.yaml": "x: 1\n"})
	blob := func(data []byte) string { return git(t, dir, string(data), "hash-object", "-w", "--stdin") }
	publish := func(ref string, entries ...string) {
		tree := git(t, dir, strings.Join(entries, "\n")+"\n", "mktree")
		git(t, dir, "", "update-ref", ref, git(t, dir, "", "commit-tree", tree, "-m", "cert"))
	}
	file := func(name, hash string) string { return "100644 blob " + hash + "\t" + name }
	seal := func(host, by string) ([]byte, []byte) {
		b, _ := certBundle(t, host)
		s, err := certshare.Seal(b, by, []certshare.Recipient{n1.recipient(), n2.recipient()}, certTime)
		if err != nil {
			t.Fatal(err)
		}
		meta, err := s.Meta.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return meta, s.Bundle
	}
	sig := func(data []byte, n certNode) []byte {
		s, err := sync.SignCert(data, n.signer)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ref := func(host string) string { return sync.CertRefPrefix + host }
	signed := func(host string, meta, bundle []byte, n certNode) {
		publish(ref(host), file("bundle.age", blob(bundle)), file("cert.yaml", blob(meta)), file("cert.yaml.sig", blob(sig(meta, n))))
	}

	good, goodBundle := seal("www.example.com", "n1")
	signed("www.example.com", good, goodBundle, n1)

	meta, bundle := seal("tampered-bundle.example.com", "n1")
	bundle[len(bundle)/2] ^= 1
	signed("tampered-bundle.example.com", meta, bundle, n1)

	meta, bundle = seal("tampered-meta.example.com", "n1")
	s := sig(meta, n1)
	meta = bytes.Replace(meta, []byte("notAfter: 2027"), []byte("notAfter: 2099"), 1)
	publish(ref("tampered-meta.example.com"), file("bundle.age", blob(bundle)), file("cert.yaml", blob(meta)), file("cert.yaml.sig", blob(s)))

	meta, bundle = seal("other-key.example.com", "n1")
	signed("other-key.example.com", meta, bundle, n2) // says n1, signed by n2

	meta, bundle = seal("unsigned.example.com", "n1")
	publish(ref("unsigned.example.com"), file("bundle.age", blob(bundle)), file("cert.yaml", blob(meta)))

	meta, bundle = seal("stranger.example.com", "n9")
	signed("stranger.example.com", meta, bundle, n9)

	meta, bundle = seal("keyless.example.com", "n3")
	publish(ref("keyless.example.com"), file("bundle.age", blob(bundle)), file("cert.yaml", blob(meta)))

	signed("mismatch.example.com", good, goodBundle, n1) // www's files on another host's ref

	signed("Upper.example.com", good, goodBundle, n1)

	meta, _ = seal("bigmeta.example.com", "n1")
	publish(ref("bigmeta.example.com"), file("cert.yaml", hashObject(t, dir, 128<<20)), file("cert.yaml.sig", blob(sig(meta, n1))))

	meta, _ = seal("bigbundle.example.com", "n1")
	publish(ref("bigbundle.example.com"), file("bundle.age", hashObject(t, dir, 128<<20)), file("cert.yaml", blob(meta)), file("cert.yaml.sig", blob(sig(meta, n1))))

	meta, bundle = seal("symlink.example.com", "n1")
	publish(ref("symlink.example.com"), file("bundle.age", blob(bundle)), "120000 blob "+blob(meta)+"\tcert.yaml", file("cert.yaml.sig", blob(sig(meta, n1))))

	token := strings.Repeat("T", 43)
	ch, err := certshare.ForChallenges("challenges.example.com", "n1", map[string]string{token: token + "." + strings.Repeat("k", 43)}, certTime)
	if err != nil {
		t.Fatal(err)
	}
	chMeta, _ := ch.Meta.Marshal()
	publish(ref("challenges.example.com"), file("cert.yaml", blob(chMeta)), file("cert.yaml.sig", blob(sig(chMeta, n1))))

	ch.Meta.Host = "stray-bundle.example.com"
	strayMeta, _ := ch.Meta.Marshal()
	signed("stray-bundle.example.com", strayMeta, goodBundle, n1)

	// A newer copy of www fetched from a remote wins over the local ref;
	// a bad one there is a problem too.
	wwwSealed := certshare.Sealed{Bundle: goodBundle}
	if wwwSealed.Meta, err = certshare.ParseMeta(good); err != nil {
		t.Fatal(err)
	}
	newer, err := wwwSealed.Republish("n2", nil, certTime.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	newerMeta, _ := newer.Meta.Marshal()
	publish(sync.RemoteCertPrefix("origin")+"www.example.com", file("bundle.age", blob(goodBundle)), file("cert.yaml", blob(newerMeta)), file("cert.yaml.sig", blob(sig(newerMeta, n2))))
	publish(sync.RemoteCertPrefix("origin")+"unsigned.example.com", file("cert.yaml", blob(chMeta)))
	// Not certificate refs at all.
	publish("refs/heads/certs/www.example.com", file("cert.yaml", blob(good)))
	publish(render.DefaultReportRefPrefix+"n1", file("report.yaml", blob((&report.Report{Node: "n1", Time: certTime}).Marshal())))

	repo, err := sync.OpenRepo(dir)
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	certs, problems, err := sync.ReadCerts(repo, publishers, keys)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
		t.Errorf("reading the certificates allocated %d MiB next to two 128 MiB objects", alloc>>20)
	}
	if len(certs) != 3 || certs["www.example.com"].Meta.PublishedBy != "n2" || !certs["www.example.com"].Signed ||
		certs["keyless.example.com"].Signed || certs["challenges.example.com"].Meta.Certificate != nil {
		t.Errorf("certificates read: %v", certs)
	}
	want := map[string]string{
		`"tampered-bundle.example.com"`:                "does not match",
		`"tampered-meta.example.com"`:                  "bad signature",
		`"other-key.example.com"`:                      "bad signature",
		`"unsigned.example.com" on refs/keel/certs/`:   "not signed",
		`"unsigned.example.com" on refs/keel/remotes/`: "names host",
		`"stranger.example.com"`:                       "not an ingress node",
		`"mismatch.example.com"`:                       "names host \"www.example.com\"",
		`"Upper.example.com"`:                          "does not name a host",
		`"bigmeta.example.com"`:                        "too large",
		`"bigbundle.example.com"`:                      "too large",
		`"symlink.example.com"`:                        "not a regular file",
		`"stray-bundle.example.com"`:                   "holds no certificate",
	}
	if len(problems) != len(want) {
		t.Errorf("%d problems, want %d:\n%s", len(problems), len(want), strings.Join(problems, "\n"))
	}
	for host, reason := range want {
		found := false
		for _, p := range problems {
			if strings.Contains(p, host) && strings.Contains(p, reason) {
				found = true
			}
		}
		if !found {
			t.Errorf("no problem for %s with %q in:\n%s", host, reason, strings.Join(problems, "\n"))
		}
	}
}

func TestCertRefRefusesNamesOutsideItsNamespace(t *testing.T) {
	for _, host := range []string{"", "..", "../heads/main", "a/b.example.com", "Www.example.com", "www.example.lock", "example", "www.example.com/"} {
		if ref, err := sync.CertRef(host); err == nil {
			t.Errorf("CertRef(%q) = %s", host, ref)
		}
	}
	if ref, err := sync.CertRef("www.example.com"); err != nil || ref.String() != "refs/keel/certs/www.example.com" {
		t.Errorf("CertRef: %s %v", ref, err)
	}
	// Nor does PublishCert take one, whatever the metadata says.
	ctx := context.Background()
	bare, _ := server(t)
	m, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "repo"), sync.Remote{URL: bare, Branch: "main"}, render.DefaultReportRefPrefix)
	if err != nil {
		t.Fatal(err)
	}
	s, err := certshare.ForChallenges("www.example.com", "n1", nil, certTime)
	if err != nil {
		t.Fatal(err)
	}
	s.Meta.Host = "../heads/main"
	if _, err := m.PublishCert(ctx, s, nil, certTime); err == nil {
		t.Error("a certificate for ../heads/main was published")
	}
	if out := git(t, bare, "", "for-each-ref", "refs/keel/"); out != "" {
		t.Errorf("refs published: %s", out)
	}
}

// TestFetchLeavesOutACertBomb: a certificate ref whose cert.yaml inflates
// past the fetch limits is left out of the fetch (and said so), the other
// refs are fetched around it, and a certificate ref deleted on the remote
// is deleted here in that mode too.
func TestFetchLeavesOutACertBomb(t *testing.T) {
	remote := commitTree(t, map[string]string{"cluster.yaml": "x: 1\n"})
	publish := func(ref string, entries ...string) {
		tree := git(t, remote, strings.Join(entries, "\n")+"\n", "mktree")
		git(t, remote, "", "update-ref", ref, git(t, remote, "", "commit-tree", tree, "-m", "x"))
	}
	small := "100644 blob " + git(t, remote, "host: x\n", "hash-object", "-w", "--stdin") + "\tcert.yaml"
	publish(sync.CertRefPrefix+"bomb.example.com", "100644 blob "+hashObject(t, remote, sync.MaxObjectSize+1<<20)+"\tcert.yaml")
	publish(sync.CertRefPrefix+"good.example.com", small)
	publish(sync.CertRefPrefix+"other.example.com", small)
	ctx := context.Background()
	m, err := sync.OpenMirror(ctx, filepath.Join(t.TempDir(), "repo"), sync.Remote{URL: remote, Branch: "main"}, render.DefaultReportRefPrefix)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := m.Fetch(ctx)
	if err != nil {
		t.Fatalf("a certificate bomb made the fetch fail: %v", err)
	}
	if len(refs.Certs) != 2 || refs.Tip.IsZero() {
		t.Errorf("fetched %+v, want the tip and two certificate refs", refs)
	}
	if len(refs.Skipped) != 1 || !strings.Contains(refs.Skipped[0], "certificate ref refs/keel/certs/bomb.example.com") {
		t.Errorf("skipped %q", refs.Skipped)
	}
	git(t, remote, "", "update-ref", "-d", sync.CertRefPrefix+"good.example.com")
	refs, err = m.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := refs.Certs["good.example.com"]; ok || len(refs.Certs) != 1 {
		t.Errorf("after the remote deleted a certificate ref: %v", refs.Certs)
	}
}
