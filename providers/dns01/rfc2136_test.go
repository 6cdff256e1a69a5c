package dns01

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func rfc2136Config(z *testZone, secret string, timeout time.Duration) string {
	return fmt.Sprintf("provider: rfc2136\nserver: %s\ntsigKey: %s\ntsigSecret: %s\nttl: 60\n", z.ns[0].addr, testKeyName, secret) +
		z.propagationSettings(timeout)
}

// A record added by RFC 2136 is served by both servers when Present
// returns (ns2 lagging behind ns1), two challenges for one name (a
// wildcard and its base domain) coexist, and CleanUp removes exactly its
// own record.
func TestRFC2136PresentCleanUp(t *testing.T) {
	t.Parallel()
	const lag = 3
	z := newTestZone(t, "example.test", lag)
	p, err := Load(writeConfig(t, rfc2136Config(z, testKeySecret, 30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	const name = "_acme-challenge.www.example.test."
	base, wild := "token-1.thumbprint", "token-2.thumbprint"

	if err := p.Present(ctx, "www.example.test", base); err != nil {
		t.Fatal(err)
	}
	// Present waited for the secondary: it had to be asked past its lag.
	if got := z.txtQueries(1); got < lag {
		t.Errorf("ns2 was asked %d times; Present returned before it could serve the record", got)
	}
	for i := range z.ns {
		if got, want := z.served(i, name), []string{RecordValue(base)}; !slices.Equal(got, want) {
			t.Errorf("%s serves %q, want %q", z.ns[i].name, got, want)
		}
	}

	if err := p.Present(ctx, "*.www.example.test", wild); err != nil {
		t.Fatal(err)
	}
	want := []string{RecordValue(base), RecordValue(wild)}
	slices.Sort(want)
	if got, _ := z.txt(t, 0, name); !slices.Equal(got, want) {
		t.Errorf("ns1 serves %q, want both challenges' values %q", got, want)
	}

	if err := p.CleanUp(ctx, "www.example.test", base); err != nil {
		t.Fatal(err)
	}
	if got, _ := z.txt(t, 0, name); !slices.Equal(got, []string{RecordValue(wild)}) {
		t.Errorf("after CleanUp of one challenge ns1 serves %q, want only the other's", got)
	}
	if err := p.CleanUp(ctx, "*.www.example.test", wild); err != nil {
		t.Fatal(err)
	}
	if got, rcode := z.txt(t, 0, name); len(got) != 0 || rcode != dns.RcodeNameError {
		t.Errorf("after both CleanUps ns1 answers %s %q, want NXDOMAIN", dns.RcodeToString[rcode], got)
	}
}

// A wrong secret or an unknown key name gets a clear error naming the
// TSIG problem, without the secret, and changes nothing.
func TestRFC2136WrongKey(t *testing.T) {
	t.Parallel()
	z := newTestZone(t, "example.test", 0)
	wrong := "d3Jvbmctc2VjcmV0LW5vdC10aGUtem9uZXMta2V5LTAxMjM0NTY3ODk=" // base64, another 40-byte key
	for _, tc := range []struct {
		name, config, want string
	}{
		{"wrong secret", rfc2136Config(z, wrong, 5*time.Second), "TSIG BADSIG"},
		{"unknown key", strings.Replace(rfc2136Config(z, wrong, 5*time.Second), "tsigKey: "+testKeyName, "tsigKey: other-key.", 1), "TSIG BADKEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Load(writeConfig(t, tc.config))
			if err != nil {
				t.Fatal(err)
			}
			err = p.Present(testCtx(t), "www.example.test", "token.thumbprint")
			if err == nil {
				t.Fatal("Present succeeded with a wrong TSIG key")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "check tsigKey") {
				t.Errorf("error %q does not say %q and what to check", err, tc.want)
			}
			if errors.Is(err, ErrNotVisible) {
				t.Errorf("a refused update is reported as a propagation timeout: %v", err)
			}
			t.Logf("error: %v", err)
			noSecret(t, err, wrong, testKeySecret)
			if got := z.served(0, "_acme-challenge.www.example.test."); len(got) != 0 {
				t.Errorf("the refused update changed the zone: %q", got)
			}
		})
	}
}

// _acme-challenge delegated by a CNAME: the record is written and checked
// at the CNAME's target, where the CA looks.
func TestRFC2136FollowsCNAME(t *testing.T) {
	t.Parallel()
	z := newTestZone(t, "example.test", 0)
	z.set(func(rrs []dns.RR) []dns.RR {
		return append(rrs, mustRR(t, "_acme-challenge.alias.example.test. 60 IN CNAME _acme-challenge.target.example.test."))
	})
	p, err := Load(writeConfig(t, rfc2136Config(z, testKeySecret, 10*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Present(testCtx(t), "alias.example.test", "token.thumbprint"); err != nil {
		t.Fatal(err)
	}
	if got := z.served(1, "_acme-challenge.target.example.test."); !slices.Equal(got, []string{RecordValue("token.thumbprint")}) {
		t.Errorf("the CNAME's target serves %q, want the challenge's value", got)
	}
	if err := p.CleanUp(testCtx(t), "alias.example.test", "token.thumbprint"); err != nil {
		t.Fatal(err)
	}
	if got := z.served(0, "_acme-challenge.target.example.test."); len(got) != 0 {
		t.Errorf("after CleanUp the CNAME's target serves %q", got)
	}
}

// A secondary that never catches up: Present gives up after the
// propagation timeout with ErrNotVisible, naming the server.
func TestPropagationTimeout(t *testing.T) {
	t.Parallel()
	z := newTestZone(t, "example.test", 1<<30)
	p, err := Load(writeConfig(t, rfc2136Config(z, testKeySecret, 300*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	err = p.Present(testCtx(t), "www.example.test", "token.thumbprint")
	if !errors.Is(err, ErrNotVisible) {
		t.Fatalf("Present = %v, want ErrNotVisible", err)
	}
	if !strings.Contains(err.Error(), "ns2.example.test.") || strings.Contains(err.Error(), "ns1.example.test.") {
		t.Errorf("error %q should name ns2 (stale) and not ns1 (up to date)", err)
	}
	t.Logf("error: %v", err)
	if got := z.txtQueries(1); got < 2 {
		t.Errorf("ns2 was asked %d times in 300ms at a 20ms interval: the check did not poll", got)
	}
}

// A first resolver that refuses (it serves another zone only) is skipped
// for the next one.
func TestResolverFallback(t *testing.T) {
	t.Parallel()
	z := newTestZone(t, "example.test", 0)
	other := newTestZone(t, "other.test", 0)
	cfg := strings.Replace(rfc2136Config(z, testKeySecret, 10*time.Second),
		fmt.Sprintf("resolvers: [%q]", z.resolverAddr()),
		fmt.Sprintf("resolvers: [%q, %q]", other.resolverAddr(), z.resolverAddr()), 1)
	p, err := Load(writeConfig(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Present(testCtx(t), "www.example.test", "token.thumbprint"); err != nil {
		t.Fatal(err)
	}
	if got := z.served(1, "_acme-challenge.www.example.test."); !slices.Equal(got, []string{RecordValue("token.thumbprint")}) {
		t.Errorf("ns2 serves %q", got)
	}
}
