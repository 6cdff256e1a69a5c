package sync_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/keel-dev/keel/sync"
)

// pgpSignedCommit re-signs HEAD of repo with entity, the way git does with
// gpg, and returns the new commit.
func pgpSignedCommit(t *testing.T, repo string, entity *openpgp.Entity) *object.Commit {
	t.Helper()
	r, err := sync.OpenRepo(repo)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sync.ResolveCommit(r, "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	unsigned := &plumbing.MemoryObject{}
	if err := c.EncodeWithoutSignature(unsigned); err != nil {
		t.Fatal(err)
	}
	rd, _ := unsigned.Reader()
	payload, _ := io.ReadAll(rd)
	var sig bytes.Buffer
	if err := openpgp.ArmoredDetachSign(&sig, entity, bytes.NewReader(payload), nil); err != nil {
		t.Fatal(err)
	}
	c.PGPSignature = sig.String()
	obj := r.Storer.NewEncodedObject()
	if err := c.Encode(obj); err != nil {
		t.Fatal(err)
	}
	h, err := r.Storer.SetEncodedObject(obj)
	if err != nil {
		t.Fatal(err)
	}
	signed, err := r.CommitObject(h)
	if err != nil {
		t.Fatal(err)
	}
	return signed
}

func armoredPublic(t *testing.T, e *openpgp.Entity) string {
	t.Helper()
	var b bytes.Buffer
	w, err := armor.Encode(&b, openpgp.PublicKeyType, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Serialize(w); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return b.String()
}

func TestVerifyOpenPGPSignedCommits(t *testing.T) {
	alice, err := openpgp.NewEntity("Alice", "", "alice@example.com", nil)
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := openpgp.NewEntity("Mallory", "", "mallory@example.com", nil)
	if err != nil {
		t.Fatal(err)
	}
	signers := sync.Signers{PGPKeyring: armoredPublic(t, alice)}
	repo := commitTree(t, map[string]string{"a": "1"})

	signedCommit(t, repo, "", "alice@example.com", "by alice")
	if who, err := signers.Verify(pgpSignedCommit(t, repo, alice)); err != nil || who != "alice@example.com" {
		t.Fatalf("a commit signed by a key of the keyring: %q %v", who, err)
	}
	if _, err := signers.Verify(pgpSignedCommit(t, repo, mallory)); err == nil {
		t.Fatal("a commit signed by a key outside the keyring passed")
	}
	signedCommit(t, repo, "", "eve@example.com", "by eve")
	if _, err := signers.Verify(pgpSignedCommit(t, repo, alice)); err == nil || !strings.Contains(err.Error(), "may not sign for eve@example.com") {
		t.Fatalf("alice's key signed for eve: %v", err)
	}
	// An SSH-signed commit with no allowed signers configured is refused.
	if _, err := (sync.Signers{PGPKeyring: signers.PGPKeyring}).Verify(&object.Commit{PGPSignature: "-----BEGIN SSH SIGNATURE-----\nx\n-----END SSH SIGNATURE-----"}); err == nil {
		t.Fatal("an SSH signature passed without allowed signers")
	}
}
