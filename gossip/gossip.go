// Package gossip is the agents' liveness and change notices: every agent
// joins one SWIM ring (hashicorp/memberlist, the library behind Consul,
// Nomad and Serf) on the port cluster.yaml names, seeded from the
// inventory's node addresses. The ring says, within seconds and with
// constant work per node, which nodes are up; each member's metadata
// carries the version of its report's content and the spec commit it last
// saw, so that a node fetches from git when a peer's report changed, not
// on every poll. Members also send each other direct messages (Send,
// Messages): the agents acknowledge a drain with their signed reports.
// Durable state stays in git: each node pushes its newest report there
// too (the ring may carry changes in between that git never sees), and a
// cluster without a ring falls back to the reports' ages and to
// acknowledgements read from git (docs/agent.md, "Gossip").
//
// Every message is encrypted and authenticated with a key from a
// node-local file (ReadKeys); only the nodes of the inventory, at their
// inventory addresses, are members.
package gossip

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	gosync "sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Config says how a node joins the ring.
type Config struct {
	// Node is this node's name; Addr its inventory address, where it
	// listens (UDP and TCP) and which it advertises.
	Node string
	Addr netip.Addr
	Port int
	// Keys are the ring's keys (ReadKeys): the first encrypts, every one
	// is accepted (a key rotation adds the new key everywhere, then makes
	// it first, then drops the old one).
	Keys [][]byte
	// Cluster names the ring: a message labelled for another cluster is
	// dropped even under the same key.
	Cluster string
	Logger  *slog.Logger
	// Timing overrides memberlist's LAN defaults (tests); zero fields keep
	// them.
	Timing Timing
	// Now is the clock the members' transitions are dated by (time.Now
	// when nil).
	Now func() time.Time
	// Meta is what the node announces from the start (a ring started
	// again keeps announcing what the last one did).
	Meta Meta
}

// Timing is the failure detector's timing: memberlist's LAN defaults are
// a probe every second, a 500 ms probe timeout, and a suspicion of 4 ×
// log10(members) probe intervals (at least 4 s, up to 6 times more while
// no other member confirms it).
type Timing struct {
	ProbeInterval    time.Duration
	ProbeTimeout     time.Duration
	SuspicionMult    int
	GossipInterval   time.Duration
	PushPullInterval time.Duration
	// TCPTimeout bounds a join's or a push-pull's TCP connection (10 s
	// by default).
	TCPTimeout time.Duration
}

// Meta is what a member announces: the content version of its report and
// the spec commit it last fetched.
type Meta struct {
	// Report is report.ContentDigest of the report it last pushed whose
	// content changed ("" before its first push).
	Report string
	// Tip is the branch tip it last fetched ("" before its first fetch).
	Tip string
}

var (
	digestRE = regexp.MustCompile(`^[0-9a-f]{32}$`)
	hashRE   = regexp.MustCompile(`^[0-9a-f]{40}$`)
)

// metaPrefix versions the metadata's encoding.
const metaPrefix = "keel1"

// leavingWord ends the metadata of a member that is leaving the ring on
// purpose (Close: its ring moves to another port or address, gossip is
// turned off, or it leaves the inventory): its peers then forget it
// rather than hold it dead, and judge it by its reports (see record).
const leavingWord = "leaving"

func (m Meta) encode() []byte {
	return []byte(metaPrefix + " " + cmpDash(m.Report) + " " + cmpDash(m.Tip))
}

func cmpDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// parseMeta reads a peer's metadata; what does not parse is no metadata
// (a member that announces nothing is fetched like one the ring does not
// know).
func parseMeta(b []byte) (Meta, bool) {
	f := strings.Fields(string(b))
	if len(f) == 4 && f[3] == leavingWord {
		f = f[:3]
	}
	if len(f) != 3 || f[0] != metaPrefix {
		return Meta{}, false
	}
	var m Meta
	if f[1] != "-" {
		if !digestRE.MatchString(f[1]) {
			return Meta{}, false
		}
		m.Report = f[1]
	}
	if f[2] != "-" {
		if !hashRE.MatchString(f[2]) {
			return Meta{}, false
		}
		m.Tip = f[2]
	}
	return m, true
}

// leavingMeta reports whether b is the metadata of a member that said it
// is leaving.
func leavingMeta(b []byte) bool {
	_, ok := parseMeta(b)
	return ok && len(strings.Fields(string(b))) == 4
}

// Member is one inventory node as this node's ring sees it.
type Member struct {
	// Alive is set while the member is alive or suspected (a suspicion
	// that the member refutes in time is no death: the hysteresis).
	Alive bool
	// Since is when it last became alive or dead in this node's view.
	Since time.Time
	// Rejoined is when it last came back after this node had seen it
	// dead (zero if it never did).
	Rejoined time.Time
	Meta     Meta
	// HasMeta is set when the member announced metadata that parses.
	HasMeta bool
}

// View is this node's view of the ring, inventory nodes only.
type View struct {
	Members map[string]Member
	// Started is when this node joined the ring.
	Started time.Time
}

// Ring is this node's membership of the gossip ring. Its methods are safe
// for concurrent use; Close stops it and waits for its goroutines.
type Ring struct {
	cfg Config
	ml  *memberlist.Memberlist
	log *slog.Logger

	mu      gosync.Mutex
	peers   map[string]netip.AddrPort // the inventory: who may be a member, and where
	members map[string]Member
	meta    Meta
	leaving bool // Close: the metadata says so
	started time.Time

	changed  chan struct{}
	messages chan Message
	rejoin   chan struct{}
	update   chan struct{}
	stop     chan struct{}
	wg       gosync.WaitGroup
	closed   gosync.Once
}

// KeySizes are the key lengths the ring takes (AES-128, -192, -256).
var KeySizes = []int{16, 24, 32}

// MaxKeyFile bounds the key file read.
const MaxKeyFile = 64 << 10

// ReadKeys reads the ring's keys from a node-local file: one key per line,
// base64 (standard encoding) of 16, 24 or 32 random bytes; blank lines and
// lines starting with # are skipped. The first key encrypts; every key is
// accepted. The keys never reach a log, a report or an error.
func ReadKeys(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gossip key file: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("gossip key file: %w", err)
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("gossip key file %s: not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("gossip key file: %w", err)
	}
	if len(data) > MaxKeyFile {
		return nil, fmt.Errorf("gossip key file %s: larger than %d bytes", path, MaxKeyFile)
	}
	var keys [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(s)
		if err != nil || !slices.Contains(KeySizes, len(k)) {
			return nil, fmt.Errorf("gossip key file %s:%d: not a key (want the base64 of 16, 24 or 32 random bytes, e.g. from: openssl rand -base64 32)", path, line)
		}
		if slices.ContainsFunc(keys, func(o []byte) bool { return bytes.Equal(o, k) }) {
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("gossip key file %s: no key in it", path)
	}
	return keys, nil
}

// Start joins the ring: it listens on cfg.Addr:cfg.Port and tries the
// inventory's other nodes (SetPeers) until it reaches them.
func Start(cfg Config) (*Ring, error) {
	if len(cfg.Keys) == 0 {
		return nil, errors.New("gossip needs a key")
	}
	if !cfg.Addr.IsValid() || cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("gossip address %s port %d is not an address to listen on", cfg.Addr, cfg.Port)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Ring{
		cfg: cfg, log: cfg.Logger.With("component", "gossip"),
		peers: map[string]netip.AddrPort{}, members: map[string]Member{},
		changed: make(chan struct{}, 1), messages: make(chan Message, messageBuffer), rejoin: make(chan struct{}, 1), update: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	keyring, err := memberlist.NewKeyring(cfg.Keys, cfg.Keys[0])
	if err != nil {
		return nil, fmt.Errorf("gossip keys: %w", err)
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Node
	mc.BindAddr, mc.BindPort = cfg.Addr.String(), cfg.Port
	mc.AdvertiseAddr, mc.AdvertisePort = cfg.Addr.String(), cfg.Port
	mc.Keyring = keyring
	mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	mc.Label = "keel/" + cfg.Cluster
	mc.RequireNodeNames = true
	mc.Delegate = (*delegate)(r)
	mc.Events = (*events)(r)
	mc.Alive = (*admission)(r)
	mc.Logger = log.New(&logWriter{log: r.log}, "", 0)
	t := cfg.Timing
	if t.ProbeInterval > 0 {
		mc.ProbeInterval = t.ProbeInterval
	}
	if t.ProbeTimeout > 0 {
		mc.ProbeTimeout = t.ProbeTimeout
	}
	if t.SuspicionMult > 0 {
		mc.SuspicionMult = t.SuspicionMult
	}
	if t.GossipInterval > 0 {
		mc.GossipInterval = t.GossipInterval
	}
	if t.PushPullInterval > 0 {
		mc.PushPullInterval = t.PushPullInterval
	}
	if t.TCPTimeout > 0 {
		mc.TCPTimeout = t.TCPTimeout
	}
	// The ring's own node is a member from the start, and the inventory
	// check must let it in before SetPeers is first called.
	r.peers[cfg.Node] = netip.AddrPortFrom(cfg.Addr, uint16(cfg.Port))
	r.started = cfg.Now()
	r.meta = cfg.Meta
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: mc.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("gossip on %s: %w", netip.AddrPortFrom(cfg.Addr, uint16(cfg.Port)), err)
	}
	mc.Transport = &deadlineTransport{NetTransport: nt, timeout: mc.TCPTimeout}
	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = nt.Shutdown()
		return nil, fmt.Errorf("gossip on %s: %w", netip.AddrPortFrom(cfg.Addr, uint16(cfg.Port)), err)
	}
	r.ml = ml
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		r.joinLoop()
	}()
	go func() {
		defer r.wg.Done()
		r.updateLoop()
	}()
	return r, nil
}

// SetPeers sets the inventory: the nodes that may be members, at their
// addresses and the ring's port. Members no longer listed drop out of the
// view at once; the listed ones that are not alive are joined.
func (r *Ring) SetPeers(peers map[string]netip.AddrPort) {
	r.mu.Lock()
	peers = maps.Clone(peers)
	peers[r.cfg.Node] = netip.AddrPortFrom(r.cfg.Addr, uint16(r.cfg.Port))
	changed := !maps.Equal(peers, r.peers)
	r.peers = peers
	for name := range r.members {
		if _, ok := peers[name]; !ok {
			delete(r.members, name)
		}
	}
	r.mu.Unlock()
	if changed {
		r.admitKnown()
		r.poke(r.rejoin)
		r.poke(r.changed)
	}
}

// admitKnown records the members memberlist holds alive that the view
// lacks: a node removed from the inventory and listed again (or listed
// first after it joined) is alive in memberlist all along, which tells of
// it again only when it changes.
func (r *Ring) admitKnown() {
	for _, n := range r.ml.Members() {
		addr, _ := netip.AddrFromSlice(n.Addr)
		r.mu.Lock()
		want, listed := r.peers[n.Name]
		_, seen := r.members[n.Name]
		r.mu.Unlock()
		if !listed || seen || netip.AddrPortFrom(addr.Unmap(), n.Port) != want {
			continue
		}
		r.recordNew(n)
	}
}

// SetReport announces the content version (report.ContentDigest) of the
// report this node just pushed; SetTip the spec commit it just fetched.
// A change reaches every member within a few gossip rounds, and the
// members that missed it get it at their next push-pull exchange.
func (r *Ring) SetReport(digest string) { r.announce(func(m *Meta) { m.Report = digest }) }

// SetTip: see SetReport.
func (r *Ring) SetTip(hash string) { r.announce(func(m *Meta) { m.Tip = hash }) }

func (r *Ring) announce(edit func(*Meta)) {
	r.mu.Lock()
	before := r.meta
	edit(&r.meta)
	same := r.meta == before
	r.mu.Unlock()
	if !same {
		r.poke(r.update)
	}
}

// updateLoop broadcasts the metadata when it changes: memberlist's
// UpdateNode waits until the broadcast is out, so it runs here rather than
// on the announcer's goroutine. Changes made meanwhile go out together.
func (r *Ring) updateLoop() {
	for {
		select {
		case <-r.stop:
			return
		case <-r.update:
		}
		if err := r.ml.UpdateNode(5 * time.Second); err != nil {
			r.log.Debug("announcing the report version", "err", err)
		}
	}
}

// Meta returns what this node announces.
func (r *Ring) Meta() Meta {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.meta
}

// View returns this node's view of the ring now.
func (r *Ring) View() View {
	r.mu.Lock()
	defer r.mu.Unlock()
	return View{Members: maps.Clone(r.members), Started: r.started}
}

// Changed is ready when a member joined, died, came back or announced
// something new: it is coalesced, one signal for any number of changes.
func (r *Ring) Changed() <-chan struct{} { return r.changed }

// Close leaves the ring (telling the peers, so that they need not detect
// the departure) and stops it, waiting for its goroutines. It first
// announces that it leaves on purpose: the peers then forget this node
// rather than hold it dead (a leave alone is a death to them), so that a
// ring moved to another port or turned off by a commit the peers have not
// applied yet does not move this node's work.
func (r *Ring) Close() error {
	var err error
	r.closed.Do(func() {
		r.mu.Lock()
		r.leaving = true
		r.mu.Unlock()
		// The metadata that says "leaving" must be out before the leave
		// itself is queued: memberlist's queue drops a message about this
		// node that a newer one replaces, and a peer that never heard
		// "leaving" holds the node dead. UpdateNode returns once the
		// message has gone out as often as memberlist retransmits (a few
		// gossip rounds, under a second); the bound is for a busy machine.
		if err := r.ml.UpdateNode(announceLeaving); err != nil {
			r.log.Debug("announcing the departure", "err", err)
		}
		err = r.ml.Leave(2 * time.Second)
		err = errors.Join(err, r.halt())
	})
	return err
}

// announceLeaving bounds Close's wait for its "leaving" metadata to go out.
const announceLeaving = 5 * time.Second

// Stop stops the ring without a word to the peers: an agent that
// restarts within the failure detector's suspicion (a few seconds) is back
// before any peer holds it dead, so nothing moves; Close would make every
// peer hold it dead at once.
func (r *Ring) Stop() error {
	var err error
	r.closed.Do(func() { err = r.halt() })
	return err
}

// halt stops the ring without a word to the peers, as a crash would.
func (r *Ring) halt() error {
	close(r.stop)
	// Shut down before waiting: a join under way (a TCP timeout per
	// unreachable node) then fails at once.
	err := r.ml.Shutdown()
	r.wg.Wait()
	return err
}

// rejoinEvery is how often the inventory's nodes that are not alive are
// joined again: a ring split by a partition merges within this once the
// partition heals (memberlist itself only gossips to the dead for 30 s).
const rejoinEvery = 15 * time.Second

func (r *Ring) joinLoop() {
	tick := time.NewTicker(rejoinEvery)
	defer tick.Stop()
	for {
		r.join()
		select {
		case <-r.stop:
			return
		case <-tick.C:
		case <-r.rejoin:
		}
	}
}

// join contacts the inventory's nodes that are not alive in the view, one
// at a time, and stops between two when the ring stops: a node that drops
// the connection costs a TCP timeout (10 s), and Stop, Close and the
// agent's stall wait for the join under way.
func (r *Ring) join() {
	r.mu.Lock()
	var addrs []string
	for name, ap := range r.peers {
		if name == r.cfg.Node || r.members[name].Alive {
			continue
		}
		addrs = append(addrs, name+"/"+ap.String())
	}
	r.mu.Unlock()
	if len(addrs) == 0 {
		return
	}
	slices.Sort(addrs)
	joined := 0
	for _, addr := range addrs {
		select {
		case <-r.stop:
			return
		default:
		}
		if n, _ := r.ml.Join([]string{addr}); n > 0 {
			joined++
		}
	}
	if joined == 0 {
		r.log.Debug("joining the gossip ring: no node reached", "tried", len(addrs))
	}
}

func (r *Ring) poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// record sets what the view holds of node n after an event.
func (r *Ring) record(n *memberlist.Node, alive bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recordLocked(n, alive)
}

func (r *Ring) recordLocked(n *memberlist.Node, alive bool) {
	if _, ok := r.peers[n.Name]; !ok {
		return
	}
	if !alive && leavingMeta(n.Meta) {
		// Left on purpose: not a death. The peers judge it by its reports
		// until a ring shows it again.
		delete(r.members, n.Name)
		r.poke(r.changed)
		return
	}
	now := r.cfg.Now()
	m, seen := r.members[n.Name]
	if !seen || m.Alive != alive {
		if seen && alive && !m.Alive {
			m.Rejoined = now
		}
		m.Since = now
	}
	m.Alive = alive
	m.Meta, m.HasMeta = parseMeta(n.Meta)
	r.members[n.Name] = m
	r.poke(r.changed)
}

// recordNew records n alive unless an event recorded it meanwhile.
func (r *Ring) recordNew(n *memberlist.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.members[n.Name]; !seen {
		r.recordLocked(n, true)
	}
}

// admission lets in the inventory's nodes only, at their inventory
// addresses and the ring's port.
type admission Ring

func (a *admission) NotifyAlive(peer *memberlist.Node) error {
	r := (*Ring)(a)
	r.mu.Lock()
	want, ok := r.peers[peer.Name]
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("%q is not a node of the inventory", peer.Name)
	}
	addr, _ := netip.AddrFromSlice(peer.Addr)
	if got := netip.AddrPortFrom(addr.Unmap(), peer.Port); got != want {
		return fmt.Errorf("node %s gossips from %s, not its inventory address %s", peer.Name, got, want)
	}
	return nil
}

type events Ring

func (e *events) NotifyJoin(n *memberlist.Node)   { (*Ring)(e).record(n, true) }
func (e *events) NotifyLeave(n *memberlist.Node)  { (*Ring)(e).record(n, false) }
func (e *events) NotifyUpdate(n *memberlist.Node) { (*Ring)(e).record(n, true) }

// delegate gives memberlist this node's metadata and hands it the
// members' direct messages (message.go).
type delegate Ring

func (d *delegate) NodeMeta(limit int) []byte {
	r := (*Ring)(d)
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.meta.encode()
	if r.leaving {
		b = append(b, " "+leavingWord...)
	}
	if len(b) > limit {
		return nil
	}
	return b
}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

// logWriter turns memberlist's log lines ("[DEBUG] memberlist: ...") into
// slog records at their level.
type logWriter struct{ log *slog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	s := strings.TrimSpace(string(p))
	level := slog.LevelDebug
	switch {
	case strings.HasPrefix(s, "[ERR]"):
		level = slog.LevelWarn
	case strings.HasPrefix(s, "[WARN]"):
		level = slog.LevelInfo
	}
	if i := strings.Index(s, "memberlist: "); i >= 0 {
		s = s[i+len("memberlist: "):]
	}
	w.log.Log(context.Background(), level, s)
	return len(p), nil
}

// PeersOf lists the inventory's nodes at the ring's port.
func PeersOf(addrs map[string]netip.Addr, port int) map[string]netip.AddrPort {
	out := make(map[string]netip.AddrPort, len(addrs))
	for name, a := range addrs {
		out[name] = netip.AddrPortFrom(a, uint16(port))
	}
	return out
}
