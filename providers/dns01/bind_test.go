package dns01

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// lockedBuffer collects named's log for the failure message.
type lockedBuffer struct {
	mu stdsync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startNamed runs BIND (Debian's bind9) as the primary of example.test on
// 127.0.0.1, with the test TSIG key allowed to update
// the challenge TXT record of www.example.test only. It skips the test when
// named is not installed.
func startNamed(t *testing.T) (addr string) {
	t.Helper()
	named, err := exec.LookPath("named")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/named"); serr != nil {
			t.Skip("named not installed (Debian: apt-get install bind9); the miekg/dns primary tests cover RFC 2136 without it")
		}
		named = "/usr/sbin/named"
	}
	// named listens only on addresses of the interfaces it finds, so on
	// 127.0.0.1 (not another address of 127/8, as the miekg servers do),
	// on a port that was free a moment ago.
	ip := "127.0.0.1"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	addr = net.JoinHostPort(ip, fmt.Sprint(port))

	dir := t.TempDir()
	zone := fmt.Sprintf(`$TTL 60
@    IN SOA ns1.example.test. hostmaster.example.test. 1 3600 600 86400 60
@    IN NS  ns1.example.test.
ns1  IN A   %s
`, ip)
	in := func(name string) string { return filepath.Join(dir, name) }
	conf := fmt.Sprintf(`options {
	directory %q;
	pid-file %q;
	session-keyfile %q;
	listen-on port %d { %s; };
	listen-on-v6 { none; };
	recursion no;
	notify no;
	dnssec-validation no;
};
controls { };
key %q { algorithm hmac-sha256; secret %q; };
zone "example.test" {
	type primary;
	file %q;
	update-policy { grant %s name _acme-challenge.www.example.test. TXT; };
};
`, dir, in("named.pid"), in("session.key"), port, ip, testKeyName, testKeySecret, in("example.test.zone"), testKeyName)
	for name, content := range map[string]string{"named.conf": conf, "example.test.zone": zone} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	log := &lockedBuffer{}
	cmd := exec.Command(named, "-g", "-n", "1", "-c", filepath.Join(dir, "named.conf"))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("named's log:\n%s", log)
		}
	})

	// Poll until named answers for the zone (it loads it after binding).
	m := new(dns.Msg)
	m.SetQuestion("example.test.", dns.TypeSOA)
	c := &dns.Client{Net: "tcp", Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		r, _, err := c.Exchange(m, addr)
		if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0 {
			return addr
		}
		select {
		case <-exited:
			t.Fatalf("named exited: %v\n%s", waitErr, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("named did not serve example.test within 60s (last: %v)\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond) // poll until named has loaded the zone
	}
}

// RFC 2136 against BIND itself: the update is accepted and served, the
// cleanup removes it, a wrong secret gets BIND's BADSIG, and a name the
// update-policy does not grant is refused.
func TestRFC2136BIND(t *testing.T) {
	t.Parallel()
	addr := startNamed(t)
	_, port, _ := net.SplitHostPort(addr)
	settings := fmt.Sprintf("provider: rfc2136\nserver: %s\ntsigKey: %s\nresolvers: [%q]\nnameserverPort: %s\npropagationTimeout: 20s\npropagationInterval: 50ms\n",
		addr, testKeyName, addr, port)
	ctx := testCtx(t)
	txt := func(name string) []string {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeTXT)
		r, _, err := (&dns.Client{Net: "tcp", Timeout: 5 * time.Second}).Exchange(m, addr)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, rr := range r.Answer {
			if x, ok := rr.(*dns.TXT); ok {
				out = append(out, strings.Join(x.Txt, ""))
			}
		}
		return out
	}

	p, err := Load(writeConfig(t, settings+"tsigSecret: "+testKeySecret+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	const name = "_acme-challenge.www.example.test."
	if err := p.Present(ctx, "www.example.test", "token.thumbprint"); err != nil {
		t.Fatal(err)
	}
	if got := txt(name); !slices.Equal(got, []string{RecordValue("token.thumbprint")}) {
		t.Errorf("named serves %q after Present", got)
	}
	if err := p.CleanUp(ctx, "www.example.test", "token.thumbprint"); err != nil {
		t.Fatal(err)
	}
	if got := txt(name); len(got) != 0 {
		t.Errorf("named serves %q after CleanUp", got)
	}

	err = p.Present(ctx, "api.example.test", "token.thumbprint")
	if err == nil || !strings.Contains(err.Error(), "update refused by "+addr+": REFUSED") {
		t.Errorf("a name outside the update-policy: Present = %v, want REFUSED", err)
	}

	wrong := "d3Jvbmctc2VjcmV0LW5vdC10aGUtem9uZXMta2V5LTAxMjM0NTY3ODk="
	p, err = Load(writeConfig(t, settings+"tsigSecret: "+wrong+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = p.Present(ctx, "www.example.test", "token.thumbprint")
	if err == nil || !strings.Contains(err.Error(), "TSIG BADSIG") || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("wrong secret: Present = %v, want BIND's BADSIG", err)
	}
	noSecret(t, err, wrong, testKeySecret)
}
