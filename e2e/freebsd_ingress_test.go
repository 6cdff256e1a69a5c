//go:build linux

package e2e

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keel-dev/keel/localcluster"
)

// Issue 10: on the freebsd driver with --public-iface, the agent has pf
// send the interface's ports 80 and 443 to its ingress listeners (anchor
// keel), on the simulated host; the listeners answer there.
func TestFreeBSDIngressRedirects(t *testing.T) {
	t.Parallel()
	httpPort, httpsPort := freePort(t), freePort(t)
	ip := "127.0.1.1"
	c := newFreeBSDCluster(t, 2*time.Minute, localcluster.Options{
		Nodes: []string{"n1"},
		NodeArgs: map[string][]string{"n1": {"--public-iface", "em0",
			"--ingress-http", net.JoinHostPort(ip, itoa(httpPort)), "--ingress-https", net.JoinHostPort(ip, itoa(httpsPort))}},
		Files: map[string]string{"apps/web.yaml": fbsdWeb(1, "base/demo")},
	})
	c.converge("web")
	want := []string{
		fmt.Sprintf("rdr pass on em0 inet proto tcp from any to em0 port 80 -> %s port %d", ip, httpPort),
		fmt.Sprintf("rdr pass on em0 inet proto tcp from any to em0 port 443 -> %s port %d", ip, httpsPort),
	}
	c.waitFor("pf redirects ports 80 and 443 to the ingress", func() (bool, string) {
		st, err := c.hostState("n1")
		if err != nil {
			return false, err.Error()
		}
		got := st.PF.Anchors["keel"]
		return slices.Equal(got, want), strings.Join(got, "; ")
	})
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, itoa(httpPort)), 5*time.Second)
	if err != nil {
		t.Fatalf("the ingress's HTTP listener: %v", err)
	}
	conn.Close()
}
