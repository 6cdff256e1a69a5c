package dns01

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"

	keelacme "github.com/keel-dev/keel/providers/acme"
	"golang.org/x/crypto/acme"
)

// A Provider is what providers/acme's DNS-01 solver takes.
var _ keelacme.DNSProvider = Provider(nil)

// RecordValue(keyAuth) is the value x/crypto/acme computes from the token
// and the account key, so the ACME side may pass either.
func TestRecordValueMatchesACME(t *testing.T) {
	t.Parallel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	const token = "evaGxfADs6pSRb2LAv9IZf17Dt3juxGJ-PCt92wr-oA"
	want, err := (&acme.Client{Key: key}).DNS01ChallengeRecord(token)
	if err != nil {
		t.Fatal(err)
	}
	thumb, err := acme.JWKThumbprint(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	if got := RecordValue(token + "." + thumb); got != want {
		t.Errorf("RecordValue = %q, acme's DNS01ChallengeRecord = %q", got, want)
	}
}
