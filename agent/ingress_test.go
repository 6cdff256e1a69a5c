//go:build unix

package agent_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	sync2 "sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/agent"
	"github.com/keel-dev/keel/internal/pebble"
	"github.com/keel-dev/keel/internal/pebble/pebbletest"
	"github.com/keel-dev/keel/nodeexec/fake"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/providers"
	"github.com/keel-dev/keel/providers/certshare"
	"github.com/keel-dev/keel/providers/providertest"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/sync"
)

// ingHost is the Ingress host of the ingress tests.
const ingHost = "www.keel.test"

// ingNode is one node of an ingress test cluster.
type ingNode struct {
	name    string
	ip      string // its ingress listens on ip:httpPort and ip:httpsPort
	keyFile string // its report key, "" for a node without one
	label   string // its keel.dev/ingress label, "" for none
}

// ingCluster is a cluster repository with an Ingress with a certificate,
// a Pebble that validates at the nodes' ingress, and agents run in this
// process on the fake driver.
type ingCluster struct {
	t                   *testing.T
	bare, work          string
	nodes               []ingNode
	peb                 *pebble.Server
	httpPort, httpsPort int
	dir                 string
}

// newIngCluster writes the repository: a Service web, an Ingress for
// ingHost, and the nodes (each with an ed25519 report key unless noKey
// names it). Pebble answers ingHost with the first node's address.
func newIngCluster(t *testing.T, nodes []ingNode, noKey ...string) *ingCluster {
	t.Helper()
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	c := &ingCluster{t: t, dir: t.TempDir(), httpPort: freeTCPPort(t), httpsPort: freeTCPPort(t)}
	c.peb = pebbletest.Start(t, pebble.Options{HTTPPort: c.httpPort})
	files := map[string]string{
		"cluster.yaml": "apiVersion: keel/v1\nkind: Cluster\nmetadata: {name: t}\nspec: {livenessTTL: 6s, reportInterval: 2s}\n",
		"apps/web.yaml": "apiVersion: keel/v1\nkind: Service\nmetadata: {name: web}\nspec:\n  replicas: 1\n  port: 8080\n" +
			"  template: {image: base/x, command: [/bin/web]}\n",
		"apps/www.yaml": "apiVersion: keel/v1\nkind: Ingress\nmetadata: {name: www}\nspec:\n  host: " + ingHost +
			"\n  backend: {service: web}\n  tls: {email: ops@keel.test}\n",
	}
	for i := range nodes {
		n := &nodes[i]
		if n.ip == "" {
			n.ip = fmt.Sprintf("127.0.1.%d", i+1)
		}
		key := ""
		if !containsString(noKey, n.name) {
			n.keyFile = filepath.Join(c.dir, "keys", n.name)
			key = writeNodeKey(t, n.keyFile)
		}
		labels := ""
		if n.label != "" {
			labels = fmt.Sprintf(", labels: {keel.dev/ingress: %q}", n.label)
		}
		spec := fmt.Sprintf("address: 192.0.2.%d, capacity: {cpu: \"8\", memory: 8G}", i+1)
		if key != "" {
			spec += fmt.Sprintf(", reportKey: %q", key)
		}
		files["nodes/"+n.name+".yaml"] = fmt.Sprintf("apiVersion: keel/v1\nkind: Node\nmetadata: {name: %s%s}\nspec: {%s}\n", n.name, labels, spec)
	}
	c.nodes = nodes
	c.work, c.bare = t.TempDir(), filepath.Join(t.TempDir(), "c.git")
	for name, content := range files {
		p := filepath.Join(c.work, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(t, c.work, "init", "-q", "-b", "main")
	git(t, c.work, "add", "-A")
	git(t, c.work, "commit", "-q", "-m", "init")
	git(t, c.work, "init", "-q", "--bare", "-b", "main", c.bare)
	git(t, c.work, "push", "-q", c.bare, "main")
	git(t, c.bare, "config", "core.logAllRefUpdates", "always")
	if err := c.peb.AddA(ingHost, nodes[0].ip); err != nil {
		t.Fatal(err)
	}
	return c
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// writeNodeKey writes a new ed25519 key to path and returns its public
// half as an authorized_keys line.
func writeNodeKey(t *testing.T, path string) string {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ingAgent is a running agent of an ingCluster.
type ingAgent struct {
	node     ingNode
	stateDir string
	reg      *prometheus.Registry
	log      *lockedBuffer
	cancel   context.CancelFunc
	done     chan error
}

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu  sync2.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// start runs the agent of node i with stateDir ("" for a new one); edit,
// if set, changes its options before it starts.
func (c *ingCluster) start(i int, stateDir string, edit func(*agent.Options)) *ingAgent {
	c.t.Helper()
	n := c.nodes[i]
	if stateDir == "" {
		stateDir = c.t.TempDir()
	}
	a := &ingAgent{node: n, stateDir: stateDir, reg: prometheus.NewRegistry(), log: &lockedBuffer{}, done: make(chan error, 1)}
	opts := agent.Options{
		Node: n.name, StateDir: stateDir, Remote: sync.Remote{URL: c.bare, Branch: "main"}, Driver: fake.New(),
		Version: "0.1.0", Registry: a.reg, Poll: 200 * time.Millisecond, Reconcile: 200 * time.Millisecond, DisableWatch: true,
		Logger: slog.New(slog.NewTextHandler(a.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Ingress: &agent.IngressOptions{
			HTTPAddr: net.JoinHostPort(n.ip, strconv.Itoa(c.httpPort)), HTTPSAddr: net.JoinHostPort(n.ip, strconv.Itoa(c.httpsPort)),
			Directory: c.peb.DirectoryURL, Roots: c.peb.DirectoryRoots, HTTP01Wait: time.Second,
			RetryBase: time.Second, RetryMax: 2 * time.Second,
		},
	}
	if n.keyFile != "" {
		signer, err := sync.LoadReportSigner(n.keyFile)
		if err != nil {
			c.t.Fatal(err)
		}
		opts.ReportSigner = signer
		if opts.Ingress.Identity, err = certshare.LoadIdentity(n.keyFile); err != nil {
			c.t.Fatal(err)
		}
	}
	if edit != nil {
		edit(&opts)
	}
	ag, err := agent.New(opts)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() { a.done <- ag.Run(ctx) }()
	c.t.Cleanup(func() { a.stop(c.t) })
	return a
}

// stop stops the agent and waits for Run to return (once).
func (a *ingAgent) stop(t *testing.T) {
	t.Helper()
	if a.cancel == nil {
		return
	}
	a.cancel()
	a.cancel = nil
	select {
	case err := <-a.done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("agent %s: Run did not return within a minute of its context ending", a.node.name)
	}
	if t.Failed() {
		t.Logf("log of %s:\n%s", a.node.name, a.log.String())
	}
}

// issued is the agent's count of certificates it obtained for ingHost.
func (a *ingAgent) issued() float64 {
	return counterValue(a.reg, "keel_certificate_renewals_total", map[string]string{"host": ingHost, "result": "issued"})
}

// counterValue reads one series of a metric from reg; 0 when absent.
func counterValue(reg *prometheus.Registry, name string, labels map[string]string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// serial is the serial of the certificate node's ingress presents for
// ingHost, checked against Pebble's roots; "" and the error when the
// handshake fails.
func (c *ingCluster) serial(n ingNode) (string, error) {
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", net.JoinHostPort(n.ip, strconv.Itoa(c.httpsPort)),
		&tls.Config{ServerName: ingHost, RootCAs: c.peb.IssuingRoots})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return providers.Serial(conn.ConnectionState().PeerCertificates[0]), nil
}

// rawSerial is the serial node presents for ingHost, whoever issued it.
func (c *ingCluster) rawSerial(n ingNode) (string, error) {
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", net.JoinHostPort(n.ip, strconv.Itoa(c.httpsPort)),
		&tls.Config{ServerName: ingHost, InsecureSkipVerify: true})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return providers.Serial(conn.ConnectionState().PeerCertificates[0]), nil
}

// waitServed waits until every node of ns serves one Pebble certificate
// for ingHost, and returns its serial.
func (c *ingCluster) waitServed(ns ...ingNode) string {
	c.t.Helper()
	var serial string
	deadline := time.Now().Add(90 * time.Second)
	for {
		serials := map[string]bool{}
		var last error
		for _, n := range ns {
			s, err := c.serial(n)
			if err != nil {
				last = fmt.Errorf("%s: %w", n.name, err)
				break
			}
			serials[s] = true
			serial = s
		}
		if last == nil && len(serials) == 1 {
			return serial
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the nodes do not serve one certificate: %v, %v", serials, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// An agent restarted on a node that owns the certificate (here the only
// node) takes the shared copy back from git rather than ordering another:
// before the fix, its first pass (on the last good commit, before the
// first fetch) found no certificate and ordered a new one, at every
// restart, towards the CA's duplicate-certificate limit.
func TestIngressRestartReusesSharedCertificate(t *testing.T) {
	t.Parallel()
	c := newIngCluster(t, []ingNode{{name: "n1"}})
	state := t.TempDir()
	a := c.start(0, state, nil)
	serial := c.waitServed(c.nodes[0])
	if n := a.issued(); n != 1 {
		t.Fatalf("issued %v certificates, want 1", n)
	}
	waitFor(t, "the certificate shared in git", func() bool {
		out, err := exec.Command("git", "-C", c.bare, "for-each-ref", "refs/keel/certs/").CombinedOutput()
		return err == nil && strings.Contains(string(out), ingHost)
	})
	a.stop(t)

	b := c.start(0, state, nil)
	if s := c.waitServed(c.nodes[0]); s != serial {
		t.Fatalf("after the restart the node serves serial %s, want %s", s, serial)
	}
	// An order, if one wrongly starts, starts at the first pass and ends
	// within a few seconds against Pebble.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if n := b.issued(); n != 0 {
			t.Fatalf("the restarted agent ordered %v certificates; the shared one is valid", n)
		}
		if s, err := c.serial(c.nodes[0]); err != nil || s != serial {
			t.Fatalf("after the restart: serial %s, %v; want %s", s, err, serial)
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.checkNoKey(b, a)
}

// checkNoKey checks that the private key of the shared certificate is in
// none of the agents' debug logs, metrics or published reports.
func (c *ingCluster) checkNoKey(agents ...*ingAgent) {
	c.t.Helper()
	id, err := certshare.LoadIdentity(c.nodes[0].keyFile)
	if err != nil {
		c.t.Fatal(err)
	}
	b, err := certshare.Open(c.readCert(ingHost), id)
	if err != nil {
		c.t.Fatal(err)
	}
	block, _ := pem.Decode(b.KeyPEM)
	der := base64.StdEncoding.EncodeToString(block.Bytes)
	secrets := []string{"PRIVATE KEY", der[:40], der[len(der)-40:]}
	reports, err := exec.Command("git", "-C", c.bare, "log", "-p", "--all").CombinedOutput()
	if err != nil {
		c.t.Fatal(err)
	}
	for _, a := range agents {
		var metrics strings.Builder
		mfs, err := a.reg.Gather()
		if err != nil {
			c.t.Fatal(err)
		}
		for _, mf := range mfs {
			fmt.Fprintln(&metrics, mf.String())
		}
		for what, text := range map[string]string{"log": a.log.String(), "metrics": metrics.String(), "repository": string(reports)} {
			for _, s := range secrets {
				if strings.Contains(text, s) {
					c.t.Fatalf("the %s of %s holds the certificate's private key (%.20q)", what, a.node.name, s)
				}
			}
		}
	}
}

// owner is the owner of the Ingress www by the plan of the work tree, as
// every agent computes it before any node reports.
func (c *ingCluster) owner() string {
	c.t.Helper()
	dir, err := sync.OpenDir(c.work)
	if err != nil {
		c.t.Fatal(err)
	}
	defer dir.Close()
	m, err := render.Render(dir)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, in := range planner.Compute(planner.Input{Model: m, Now: time.Now(), AssumeAlive: true}).Ingresses {
		if in.Name == "www" {
			return in.Owner
		}
	}
	c.t.Fatal("no owner for www")
	return ""
}

// dropKey removes node i's reportKey from the inventory (and pushes): the
// node can then neither sign nor receive shared certificates.
func (c *ingCluster) dropKey(i int) {
	c.t.Helper()
	n := &c.nodes[i]
	p := filepath.Join(c.work, "nodes", n.name+".yaml")
	data, err := os.ReadFile(p)
	if err != nil {
		c.t.Fatal(err)
	}
	s := string(data)
	j := strings.Index(s, ", reportKey:")
	if j < 0 {
		c.t.Fatalf("%s has no reportKey", p)
	}
	s = s[:j] + "}\n"
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		c.t.Fatal(err)
	}
	n.keyFile = ""
	git(c.t, c.work, "commit", "-q", "-am", "no key for "+n.name)
	git(c.t, c.work, "push", "-q", c.bare, "main")
}

// A node without a reportKey issues its own certificate; the nodes that
// can receive shared certificates still get one when that node is the
// Ingress's owner. Before the fix the planner could pick the keyless node
// as owner, and the others, waiting for the owner to share, never ordered
// nor received a certificate.
func TestIngressKeylessOwnerDoesNotStarveSharingNodes(t *testing.T) {
	t.Parallel()
	c := newIngCluster(t, []ingNode{{name: "n1", label: "true"}, {name: "n2", label: "true"}})
	owner := c.owner()
	keyless, sharing := 0, 1
	if owner != c.nodes[0].name {
		keyless, sharing = 1, 0
	}
	c.dropKey(keyless)
	// The CA validates at the sharing node, which answers its own orders
	// at once and the keyless node's from git.
	if err := c.peb.AddA(ingHost, c.nodes[sharing].ip); err != nil {
		t.Fatal(err)
	}
	k := c.start(keyless, "", nil)
	s := c.start(sharing, "", nil)
	c.waitServed(c.nodes[sharing])
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := c.serial(c.nodes[keyless]); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the keyless node serves no certificate: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if k.issued() < 1 || s.issued() != 1 {
		t.Fatalf("issued: keyless %v (want its own), sharing %v (want 1)", k.issued(), s.issued())
	}
}

// certPushes counts the updates of ingHost's certificate ref in the bare
// repository (its reflog, which newIngCluster turns on).
func (c *ingCluster) certPushes() int {
	c.t.Helper()
	out, err := exec.Command("git", "-C", c.bare, "reflog", "show", "--format=%H", "refs/keel/certs/"+ingHost).CombinedOutput()
	if err != nil {
		return 0 // no ref yet
	}
	return strings.Count(string(out), "\n")
}

// steadyPushes waits until the node serves its certificate and then
// counts the pushes to the certificate ref over d.
func (c *ingCluster) steadyPushes(d time.Duration) int {
	c.t.Helper()
	// The pushes of the order itself land: the certificate's on the ref,
	// then a second with nothing after it (a busy machine took more than
	// a second between serving the certificate and pushing it).
	waitFor(c.t, "the certificate pushed", func() bool {
		_, err := exec.Command("git", "-C", c.bare, "show", "refs/keel/certs/"+ingHost+":"+certshare.MetaFile).Output()
		return err == nil
	})
	// At most 10 s: a node that pushes at every pass (the bug the callers
	// look for) never goes a second without one.
	for last, deadline := c.certPushes(), time.Now().Add(10*time.Second); time.Now().Before(deadline); {
		time.Sleep(time.Second)
		n := c.certPushes()
		if n == last {
			break
		}
		last = n
	}
	before := c.certPushes()
	time.Sleep(d)
	return c.certPushes() - before
}

// An owner whose shared copy does not read back (here: its agent runs
// without --report-key while its node has a reportKey, so its unsigned
// cert.yaml is refused) pushes it once, not at every pass: before the fix
// it published again at every pass, forever.
func TestIngressUnreadableShareIsNotRepublishedInALoop(t *testing.T) {
	t.Parallel()
	c := newIngCluster(t, []ingNode{{name: "n1"}})
	a := c.start(0, "", func(o *agent.Options) { o.ReportSigner = nil; o.Ingress.Identity = nil })
	c.waitServed(c.nodes[0])
	if n := c.steadyPushes(3 * time.Second); n != 0 {
		t.Fatalf("%d pushes to the certificate ref in 3 s of a steady cluster, want 0", n)
	}
	// The warning comes once the node has read its copy back: on a busy
	// machine, maybe after the pushes were counted.
	waitFor(t, "a warning that the shared copy is refused", func() bool {
		return strings.Contains(a.log.String(), "the certificate this node shared is refused on read")
	})
}

// A steady cluster pushes nothing to the certificate refs.
func TestIngressSteadyStateNoPushes(t *testing.T) {
	t.Parallel()
	c := newIngCluster(t, []ingNode{{name: "n1", label: "true"}, {name: "n2", label: "true"}, {name: "n3", label: "false"}})
	var agents []*ingAgent
	for i := range c.nodes {
		agents = append(agents, c.start(i, "", nil))
	}
	c.waitServed(c.nodes[0], c.nodes[1])
	if n := c.steadyPushes(5 * time.Second); n != 0 {
		t.Fatalf("%d pushes to the certificate ref in 5 s of a steady cluster, want 0", n)
	}
	if _, err := c.rawSerial(c.nodes[2]); err == nil {
		t.Fatal("n3, labelled keel.dev/ingress=false, serves the host")
	}
	// Every node that serves the certificate exports its expiry, the
	// owner or not (before, only the owner did); n3 serves none.
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", net.JoinHostPort(c.nodes[0].ip, strconv.Itoa(c.httpsPort)), &tls.Config{ServerName: ingHost, RootCAs: c.peb.IssuingRoots})
	if err != nil {
		t.Fatal(err)
	}
	notAfter := conn.ConnectionState().PeerCertificates[0].NotAfter
	conn.Close()
	for i, a := range agents {
		want := fmt.Sprintf("# HELP keel_certificate_expiry_timestamp_seconds When the certificate this node serves for a host expires, in Unix seconds.\n"+
			"# TYPE keel_certificate_expiry_timestamp_seconds gauge\nkeel_certificate_expiry_timestamp_seconds{host=%q} %d\n", ingHost, notAfter.Unix())
		if i == 2 {
			want = ""
		}
		if err := testutil.GatherAndCompare(a.reg, strings.NewReader(want), "keel_certificate_expiry_timestamp_seconds"); err != nil {
			t.Errorf("%s: %v", a.node.name, err)
		}
	}
}

// publishAs publishes s on its host's ref as node i would: signed with
// its report key, sealed to the cluster's ingress nodes.
func (c *ingCluster) publishAs(i int, s certshare.Sealed) {
	c.t.Helper()
	signer, err := sync.LoadReportSigner(c.nodes[i].keyFile)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := sync.OpenMirror(ctx, c.t.TempDir(), sync.Remote{URL: c.bare}, "refs/keel/reports/")
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := m.PublishCert(ctx, s, signer, time.Now()); err != nil {
		c.t.Fatal(err)
	}
}

// model renders the work tree.
func (c *ingCluster) model() *render.Model {
	c.t.Helper()
	dir, err := sync.OpenDir(c.work)
	if err != nil {
		c.t.Fatal(err)
	}
	defer dir.Close()
	m, err := render.Render(dir)
	if err != nil {
		c.t.Fatal(err)
	}
	return m
}

// A compromised ingress node that is not the owner publishes, under its
// own name and signature, a certificate for the host that expires in a
// hundred years. Before the fix every node took it ("expires later
// wins"), the owner too, which then never renewed: the bogus certificate
// was served everywhere for good. Now the owner's copy wins: the owner
// keeps its certificate and publishes it again, and the other nodes serve
// the owner's.
func TestIngressHostileLongLivedCertificateIsNotPinned(t *testing.T) {
	t.Parallel()
	c := newIngCluster(t, []ingNode{{name: "n1", label: "true"}, {name: "n2", label: "true"}, {name: "n3", label: "true"}})
	owner := c.owner()
	var hostile int
	for i, n := range c.nodes {
		if n.name != owner {
			hostile = i
			break
		}
	}
	// The CA validates at a node that is not the owner: the owner's
	// answers, from git, still count there.
	if err := c.peb.AddA(ingHost, c.nodes[hostile].ip); err != nil {
		t.Fatal(err)
	}
	for i := range c.nodes {
		c.start(i, "", nil)
	}
	serial := c.waitServed(c.nodes...)

	rs, _ := certshare.Recipients(c.model())
	bogus := providertest.SelfSigned(t, ingHost, time.Now().Add(-time.Hour), time.Now().Add(100*365*24*time.Hour))
	s, err := certshare.Seal(bogus, c.nodes[hostile].name, rs, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	before := c.certPushes()
	c.publishAs(hostile, s)
	// Every node serves the owner's certificate again (or never stopped).
	waitFor(t, "the hostile copy replaced by the owner's", func() bool { return c.certPushes() >= before+2 })
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range c.nodes {
			if got, err := c.rawSerial(n); err != nil || got != serial {
				t.Fatalf("%s serves %s, %v; want %s (the bogus one is %s)", n.name, got, err, serial, bogus.Serial)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, n := range c.nodes {
		if got, err := c.serial(n); err != nil || got != serial {
			t.Fatalf("%s serves %s, %v; want the owner's %s (the bogus one is %s)", n.name, got, err, serial, bogus.Serial)
		}
	}
}

// challengeAnswered reports whether node answers the HTTP-01 token.
func (c *ingCluster) challengeAnswered(n ingNode, token string) bool {
	c.t.Helper()
	res, err := http.Get("http://" + net.JoinHostPort(n.ip, strconv.Itoa(c.httpPort)) + "/.well-known/acme-challenge/" + token)
	if err != nil {
		c.t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// readCert reads the shared certificate of host from the bare repository.
// The ref may be between two pushes of its owner (an order's challenges,
// then the certificate) when the nodes already serve one: it is read again
// for up to 30 s until it holds the whole certificate.
func (c *ingCluster) readCert(host string) certshare.Sealed {
	c.t.Helper()
	show := func(file string) []byte {
		deadline := time.Now().Add(30 * time.Second)
		for {
			out, err := exec.Command("git", "-C", c.bare, "show", "refs/keel/certs/"+host+":"+file).Output()
			if err == nil {
				return out
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("git show %s: %v", file, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	m, err := certshare.ParseMeta(show(certshare.MetaFile))
	if err != nil {
		c.t.Fatal(err)
	}
	return certshare.Sealed{Meta: m, Bundle: show(certshare.BundleFile)}
}

// HTTP-01 answers count only from a host's orderers (its owner, and the
// ingress nodes that cannot receive shared certificates), and only for
// the hosts of the Ingresses: before the fix every node answered every
// token of every ref, so a compromised ingress node could have all of
// them answer its own order for a host, published on that host's ref or
// on a ref of a name no Ingress has.
func TestIngressChallengesOnlyFromOrderers(t *testing.T) {
	t.Parallel()
	c := newIngCluster(t, []ingNode{{name: "n1", label: "true"}, {name: "n2", label: "true"}, {name: "n3", label: "true"}})
	owner := c.owner()
	var hostile int
	for i, n := range c.nodes {
		if n.name != owner {
			hostile = i
			break
		}
	}
	for i := range c.nodes {
		c.start(i, "", nil)
	}
	c.waitServed(c.nodes...)

	const t1, t2 = "hostileToken1hostileToken1", "hostileToken2hostileToken2"
	thumb := strings.Repeat("A", 43)
	// The owner's copy, with the hostile node's challenge added: the
	// certificate is the same, so the owner has no reason to publish again.
	s, err := c.readCert(ingHost).Republish(c.nodes[hostile].name, map[string]string{t1: t1 + "." + thumb}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c.publishAs(hostile, s)
	other, err := certshare.ForChallenges("other.keel.test", c.nodes[hostile].name, map[string]string{t2: t2 + "." + thumb}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c.publishAs(hostile, other)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range c.nodes {
			for _, token := range []string{t1, t2} {
				if c.challengeAnswered(n, token) {
					t.Fatalf("%s answers the token %s a node that does not order published", n.name, token)
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// An agent whose ACME directory accepts connections and never answers
// stops promptly: the order in flight is cancelled, not waited for.
func TestIngressStopsWithAnOrderHanging(t *testing.T) {
	t.Parallel()
	c := newIngCluster(t, []ingNode{{name: "n1"}})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- conn // held open, never answered
		}
	}()
	a := c.start(0, "", func(o *agent.Options) {
		o.Ingress.Directory = "https://" + l.Addr().String() + "/dir"
		o.Ingress.Roots = nil
	})
	select {
	case conn := <-accepted:
		defer conn.Close()
	case <-time.After(30 * time.Second):
		t.Fatal("the agent never contacted its ACME directory")
	}
	start := time.Now()
	a.stop(t)
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("Run took %v to return with an order hanging", took)
	}
}
