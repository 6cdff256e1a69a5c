package gossip

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keel-dev/keel/internal/loopnet"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// freePort returns a port free for both TCP and UDP on 127.0.0.1.
func freePort(t *testing.T) int { return freePortTB(t) }

func freePortTB(t testing.TB) int {
	t.Helper()
	port, err := loopnet.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// fast is quick enough for tests yet not so quick that a busy machine
// (a probe answered late under load) makes members flap: a probe has
// 400 ms, and a suspicion 3 probe rounds to be refuted.
var fast = Timing{ProbeInterval: 500 * time.Millisecond, ProbeTimeout: 400 * time.Millisecond, SuspicionMult: 3,
	GossipInterval: 50 * time.Millisecond, PushPullInterval: time.Second}

func key(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

type testRing struct {
	name string
	port int
	*Ring
}

// startRings starts one ring per name, each knowing the inventory names
// (at their ports); keys gives each ring's keys (default key(1)).
func startRings(t *testing.T, inventory []string, keys map[string][][]byte, start ...string) map[string]*testRing {
	t.Helper()
	ports := map[string]int{}
	for _, n := range append(inventory, start...) {
		if ports[n] == 0 {
			ports[n] = freePort(t)
		}
	}
	peers := map[string]netip.AddrPort{}
	for _, n := range inventory {
		peers[n] = netip.AddrPortFrom(loopback, uint16(ports[n]))
	}
	rings := map[string]*testRing{}
	for _, n := range start {
		k := keys[n]
		if k == nil {
			k = [][]byte{key(1)}
		}
		r, err := Start(Config{Node: n, Addr: loopback, Port: ports[n], Keys: k, Cluster: "test", Timing: fast})
		if err != nil {
			t.Fatalf("start %s: %v", n, err)
		}
		t.Cleanup(func() { r.Close() })
		r.SetPeers(peers)
		rings[n] = &testRing{name: n, port: ports[n], Ring: r}
	}
	return rings
}

// waitView polls until cond holds for r's view.
func waitView(t *testing.T, r *testRing, what string, cond func(View) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !cond(r.View()) {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %s never held; view %+v", r.name, what, r.View())
		case <-r.Changed():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func aliveSet(v View) string {
	var names []string
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		if v.Members[n].Alive {
			names = append(names, n)
		}
	}
	return strings.Join(names, ",")
}

func TestRingLivenessAndMeta(t *testing.T) {
	rings := startRings(t, []string{"a", "b", "c"}, nil, "a", "b", "c")
	for _, r := range rings {
		waitView(t, r, "all alive", func(v View) bool { return aliveSet(v) == "a,b,c" })
	}
	// A change of report version reaches the others.
	meta := Meta{Report: strings.Repeat("ab", 16), Tip: strings.Repeat("0123456789", 4)}
	rings["a"].SetReport(meta.Report)
	rings["a"].SetTip(meta.Tip)
	for _, n := range []string{"b", "c"} {
		waitView(t, rings[n], "a's new meta", func(v View) bool { return v.Members["a"].HasMeta && v.Members["a"].Meta == meta })
	}
	// A node that vanishes (no leave message) is found dead.
	halted := time.Now()
	rings["c"].closed.Do(func() {
		if err := rings["c"].halt(); err != nil {
			t.Error(err)
		}
	})
	for _, n := range []string{"a", "b"} {
		waitView(t, rings[n], "c dead", func(v View) bool { m, ok := v.Members["c"]; return ok && !m.Alive })
	}
	// Dated at the death, not at a return: on a busy machine c may have
	// been suspected and come back before (Rejoined then dates that).
	if m := rings["a"].View().Members["c"]; m.Since.Before(halted) || !m.Rejoined.Before(m.Since) {
		t.Errorf("c's death not dated, or dated as a return (halted at %v): %+v", halted, m)
	}
}

func TestRingComesBackAndIsDatedRejoined(t *testing.T) {
	rings := startRings(t, []string{"a", "b", "c"}, nil, "a", "b", "c")
	waitView(t, rings["a"], "all alive", func(v View) bool { return aliveSet(v) == "a,b,c" })
	port := rings["c"].port
	// c vanishes (no leave message: a Close is no death, see
	// TestRingCloseIsNoDeath).
	rings["c"].closed.Do(func() {
		if err := rings["c"].halt(); err != nil {
			t.Error(err)
		}
	})
	waitView(t, rings["a"], "c dead", func(v View) bool { m, ok := v.Members["c"]; return ok && !m.Alive })
	// c starts again on the same address: the rejoin loop (or its own
	// join) brings it back, dated as a return.
	peers := map[string]netip.AddrPort{}
	for n, r := range rings {
		peers[n] = netip.AddrPortFrom(loopback, uint16(r.port))
	}
	var c *Ring
	var err error
	for range 50 { // the old socket may linger for a moment
		if c, err = Start(Config{Node: "c", Addr: loopback, Port: port, Keys: [][]byte{key(1)}, Cluster: "test", Timing: fast}); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetPeers(peers)
	waitView(t, rings["a"], "c back", func(v View) bool { return v.Members["c"].Alive && !v.Members["c"].Rejoined.IsZero() })
}

func TestRingAdmitsOnlyTheInventoryWithTheKey(t *testing.T) {
	// d holds another key; e holds the key but is not in the inventory
	// (its own list says it is, and it knows where a is).
	rings := startRings(t, []string{"a", "b", "d"}, map[string][][]byte{"d": {key(2)}}, "a", "b", "d", "e")
	peers := map[string]netip.AddrPort{"a": netip.AddrPortFrom(loopback, uint16(rings["a"].port)), "e": netip.AddrPortFrom(loopback, uint16(rings["e"].port))}
	rings["e"].SetPeers(peers)
	waitView(t, rings["a"], "b alive", func(v View) bool { return v.Members["b"].Alive })
	waitView(t, rings["b"], "a alive", func(v View) bool { return v.Members["a"].Alive })
	// Give d and e time to try (joins every rejoinEvery, gossip all along).
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		// (a and b may suspect each other for a moment on a busy
		// machine: what matters is that neither ever admits d or e.)
		for _, n := range []string{"a", "b"} {
			if v := rings[n].View(); v.Members["d"].Alive || v.Members["e"].Alive {
				t.Fatalf("%s sees %q alive, want a,b only (d has the wrong key, e is not in the inventory)", n, aliveSet(v))
			}
		}
		if got := aliveSet(rings["d"].View()); got != "d" {
			t.Fatalf("d, with the wrong key, sees %q", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestRingKeyRotation(t *testing.T) {
	// Mid-rotation: a encrypts with the new key and still accepts the old;
	// b has not moved yet but was given the new key as a second one.
	keys := map[string][][]byte{"a": {key(2), key(1)}, "b": {key(1), key(2)}}
	rings := startRings(t, []string{"a", "b"}, keys, "a", "b")
	for _, r := range rings {
		waitView(t, r, "both alive", func(v View) bool { return aliveSet(v) == "a,b" })
	}
}

func TestReadKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	k1, k2 := base64.StdEncoding.EncodeToString(key(1)), base64.StdEncoding.EncodeToString(key(2)[:16])
	keys, err := ReadKeys(write("ok", "# the ring's keys, the first encrypts\n"+k1+"\n\n"+k2+"\n"+k1+"\n"))
	if err != nil || len(keys) != 2 || !bytes.Equal(keys[0], key(1)) || !bytes.Equal(keys[1], key(2)[:16]) {
		t.Fatalf("ReadKeys = %d keys, %v", len(keys), err)
	}
	secret := base64.StdEncoding.EncodeToString([]byte("twenty-byte-secret!!"))
	for name, data := range map[string]string{
		"empty":   "# nothing\n",
		"badsize": k1 + "\n" + secret + "\n",
		"notb64":  "not base64 at all\n",
	} {
		_, err := ReadKeys(write(name, data))
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), k1) {
			t.Errorf("%s: the error quotes a key: %v", name, err)
		}
	}
	if _, err := ReadKeys(dir); err == nil {
		t.Error("a directory was read as a key file")
	}
	if _, err := ReadKeys(write("huge", strings.Repeat("#", MaxKeyFile+1))); err == nil {
		t.Error("an oversized key file was read")
	}
}

func TestMetaParsing(t *testing.T) {
	m := Meta{Report: strings.Repeat("0f", 16), Tip: strings.Repeat("a", 40)}
	if got, ok := parseMeta(m.encode()); !ok || got != m {
		t.Fatalf("round trip: %+v %v", got, ok)
	}
	if got, ok := parseMeta(Meta{}.encode()); !ok || got != (Meta{}) {
		t.Fatalf("empty round trip: %+v %v", got, ok)
	}
	if m, ok := parseMeta(append(m.encode(), " leaving"...)); !ok || m.Tip == "" || !leavingMeta(append(m.encode(), " leaving"...)) || leavingMeta(m.encode()) {
		t.Errorf("a leaving member's metadata: %+v %v", m, ok)
	}
	for _, bad := range []string{"", "keel2 - -", "keel1 - - extra", "keel1 - - leaving extra", "keel1 XYZ -", "keel1 - ../../etc", "keel1 " + strings.Repeat("0F", 16) + " -"} {
		if _, ok := parseMeta([]byte(bad)); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestRingCloseIsNoDeath: a member that leaves on purpose (Close: its ring
// moves to another port, or a commit turns gossip off, before its peers
// apply that commit) is forgotten, not held dead: a death would move its
// work at once, though it is alive and reporting. A member that vanishes
// is still found dead (TestRingLivenessAndMeta).
func TestRingCloseIsNoDeath(t *testing.T) {
	rings := startRings(t, []string{"a", "b", "c"}, nil, "a", "b", "c")
	for _, n := range []string{"a", "b", "c"} {
		waitView(t, rings[n], "all alive", func(v View) bool { return aliveSet(v) == "a,b,c" })
	}
	if err := rings["c"].Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} {
		waitView(t, rings[n], "c gone", func(v View) bool { m, ok := v.Members["c"]; return !ok || !m.Alive })
		if m, ok := rings[n].View().Members["c"]; ok {
			t.Errorf("%s holds c, which left on purpose, as %+v: dead at once", n, m)
		}
	}
	// Back (the same name and address): a member again, not dated as a
	// return from the dead.
	r, err := Start(Config{Node: "c", Addr: loopback, Port: rings["c"].port, Keys: [][]byte{key(1)}, Cluster: "test", Timing: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.SetPeers(map[string]netip.AddrPort{"a": netip.AddrPortFrom(loopback, uint16(rings["a"].port))})
	waitView(t, rings["a"], "c back", func(v View) bool { return v.Members["c"].Alive })
	if m := rings["a"].View().Members["c"]; !m.Rejoined.IsZero() {
		t.Errorf("c back after leaving on purpose is dated as a return from the dead: %+v", m)
	}
}

// TestRingStopsDuringAJoin: joining nodes that drop the connection (down,
// firewalled) costs a TCP timeout each; stopping the ring (the agent's
// shutdown, a stuck loop, a ring that moves) waits for one at most, not
// for every unreachable node of the inventory in turn.
func TestRingStopsDuringAJoin(t *testing.T) {
	// A listener whose accept queue is full drops the SYNs: a dial to it
	// hangs until its timeout.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	hole := netip.AddrPortFrom(loopback, uint16(sa.(*syscall.SockaddrInet4).Port))
	c, err := net.Dial("tcp", hole.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c, err := net.DialTimeout("tcp", hole.String(), 200*time.Millisecond); err == nil {
		c.Close()
		t.Skip("this system does not drop the SYNs of a full accept queue")
	}

	var logs lockedBuffer
	timing := fast
	timing.TCPTimeout = time.Second
	port := freePort(t)
	r, err := Start(Config{Node: "a", Addr: loopback, Port: port, Keys: [][]byte{key(1)}, Cluster: "test", Timing: timing,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	peers := map[string]netip.AddrPort{}
	for i := range 8 {
		peers[fmt.Sprintf("x%d", i)] = hole
	}
	r.SetPeers(peers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !strings.Contains(logs.String(), "failed to join") {
		select {
		case <-ctx.Done():
			t.Fatalf("no join tried: %s", logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	start := time.Now()
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	// Seven more nodes would take 7 s; one, 1 s.
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("Stop took %s during a join of unreachable nodes (a TCP timeout is 1 s)", took)
	}
}

type lockedBuffer struct {
	mu sync.Mutex
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

// TestRingListsAgainAMemberAlreadyAlive: a node dropped from the inventory
// and listed again (a commit reverted) never stopped being alive in
// memberlist, which tells of it only when it changes: the view must hold
// it again at once, not judge it by its reports until its next change.
func TestRingListsAgainAMemberAlreadyAlive(t *testing.T) {
	rings := startRings(t, []string{"a", "b"}, nil, "a", "b")
	waitView(t, rings["a"], "both alive", func(v View) bool { return aliveSet(v) == "a,b" })
	all := map[string]netip.AddrPort{
		"a": netip.AddrPortFrom(loopback, uint16(rings["a"].port)),
		"b": netip.AddrPortFrom(loopback, uint16(rings["b"].port)),
	}
	rings["a"].SetPeers(map[string]netip.AddrPort{"a": all["a"]})
	if _, ok := rings["a"].View().Members["b"]; ok {
		t.Fatal("b still in the view after it left the inventory")
	}
	rings["a"].SetPeers(all)
	if m := rings["a"].View().Members["b"]; !m.Alive {
		t.Errorf("b, alive all along, is not in the view once listed again: %+v", m)
	}
}
