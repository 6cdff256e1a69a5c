package agent

import (
	"cmp"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	gosync "sync"
	"time"

	"github.com/keel-dev/keel/gossip"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
)

// ringKeeper owns this node's membership of the gossip ring: it starts
// the ring when the applied commit turns gossip on (spec.gossip), moves it
// when the port or the node's address changes, leaves it when gossip is
// turned off or the node leaves the inventory, and keeps what this node
// announces across those restarts. The loop calls apply and view; the
// publisher and the git worker announce through it from their goroutines.
type ringKeeper struct {
	node    string
	keyFile string
	timing  gossip.Timing
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time

	mu   gosync.Mutex
	ring *gossip.Ring
	// at is the address and port the ring listens on, cluster its name.
	at      netip.AddrPort
	cluster string
	meta    gossip.Meta // what this node announces, kept across restarts
	// failed is the configuration the last start failed with, and when:
	// it is tried again after retryStart, not at every pass.
	failed   netip.AddrPort
	failedAt time.Time
	// changed carries the ring's Changed signals to the loop; it stays the
	// same channel across ring restarts.
	changed chan struct{}
	// messages carries the members' direct messages to their receiver
	// (drainAcks); the same channel across ring restarts.
	messages chan gossip.Message
	// seen is when a ring of this node last saw each inventory node alive
	// (this node's clock), kept across the ring's restarts and after it
	// stops (planner.Gossip.Seen): the reports of the nodes a ring
	// vouched for were not fetched, and must not make them look dead to
	// the ring that follows, or to none.
	seen    map[string]time.Time
	forward gosync.WaitGroup
	stopFwd chan struct{}
}

// retryStart is how long a ring that failed to start (a port in use, a
// missing key file) waits before it is tried again.
const retryStart = 30 * time.Second

func newRingKeeper(opts Options, log *slog.Logger, metrics *Metrics) *ringKeeper {
	return &ringKeeper{
		node: opts.Node, keyFile: opts.GossipKeyFile, timing: opts.GossipTiming, log: log, metrics: metrics, now: opts.Now,
		changed: make(chan struct{}, 1), messages: make(chan gossip.Message, 64), seen: map[string]time.Time{},
	}
}

// apply makes the ring follow the applied model: started, moved or left.
// Called by the loop.
func (k *ringKeeper) apply(m *render.Model, leaving bool) {
	var want netip.AddrPort
	self := m.Node(k.node)
	if g := m.Cluster.Gossip; g != nil && self != nil && !leaving {
		want = netip.AddrPortFrom(self.Address.Addr, uint16(g.Port))
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for name := range k.seen {
		if m.Node(name) == nil {
			delete(k.seen, name)
		}
	}
	if k.ring != nil && (want != k.at || m.Cluster.Name != k.cluster) {
		k.stopLocked(true)
	}
	if !want.IsValid() {
		k.metrics.GossipMembers.Reset()
		return
	}
	if k.ring == nil {
		if want == k.failed && k.now().Sub(k.failedAt) < retryStart {
			return
		}
		if err := k.startLocked(want, m.Cluster.Name); err != nil {
			k.failed, k.failedAt = want, k.now()
			k.log.Warn("cannot join the gossip ring: liveness falls back to the reports' ages", "listen", want.String(), "err", err)
			return
		}
		k.failed = netip.AddrPort{}
		k.log.Info("joined the gossip ring", "listen", want.String(), "nodes", len(m.Nodes))
	}
	addrs := make(map[string]netip.Addr, len(m.Nodes))
	for _, n := range m.Nodes {
		addrs[n.Name] = n.Address.Addr
	}
	k.ring.SetPeers(gossip.PeersOf(addrs, int(want.Port())))
}

func (k *ringKeeper) startLocked(at netip.AddrPort, cluster string) error {
	if k.keyFile == "" {
		return fmt.Errorf("cluster.yaml turns gossip on (spec.gossip) but the agent has no --gossip-key file")
	}
	keys, err := gossip.ReadKeys(k.keyFile)
	if err != nil {
		return err
	}
	ring, err := gossip.Start(gossip.Config{
		Node: k.node, Addr: at.Addr(), Port: int(at.Port()), Keys: keys, Cluster: cluster,
		Logger: k.log, Timing: k.timing, Now: k.now, Meta: k.meta,
	})
	if err != nil {
		return err
	}
	k.ring, k.at, k.cluster = ring, at, cluster
	stop := make(chan struct{})
	k.stopFwd = stop
	k.forward.Add(1)
	go func() {
		defer k.forward.Done()
		for {
			select {
			case <-stop:
				return
			case <-ring.Changed():
				select {
				case k.changed <- struct{}{}:
				default:
				}
			case m := <-ring.Messages():
				select {
				case k.messages <- m:
				default: // the receiver is behind: the senders repeat what matters
				}
			}
		}
	}()
	return nil
}

// stopLocked stops the ring; leave says goodbye to the peers first (the
// ring moves or is turned off), which makes them hold this node dead at
// once.
func (k *ringKeeper) stopLocked(leave bool) {
	close(k.stopFwd)
	k.forward.Wait()
	stop := k.ring.Stop
	if leave {
		stop = k.ring.Close
	}
	if err := stop(); err != nil {
		k.log.Debug("leaving the gossip ring", "err", err)
	}
	k.ring, k.at = nil, netip.AddrPort{}
}

// close stops the ring, if this node is in one, without leaving it: an
// agent that stops to restart (an upgrade) is back before its peers hold
// it dead.
func (k *ringKeeper) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ring != nil {
		k.stopLocked(false)
	}
}

// stall stops the ring, without leaving it, because the agent's loop is
// stuck (the publisher found it): the peers find this node dead within
// seconds, as they would find its reports stale without a ring. The next
// pass of the loop starts it again (apply).
func (k *ringKeeper) stall() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ring != nil {
		k.log.Warn("the agent loop is stuck: leaving the gossip ring until it passes again")
		k.stopLocked(false)
	}
}

// on reports whether this node is in a ring now.
func (k *ringKeeper) on() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.ring != nil
}

// announceReport and announceTip tell the ring what this node pushed or
// fetched; they may block for a few seconds (the broadcast), so they run
// on the publisher's and the git worker's goroutines, never the loop's.
func (k *ringKeeper) announceReport(digest string) {
	k.mu.Lock()
	k.meta.Report = digest
	ring := k.ring
	k.mu.Unlock()
	if ring != nil {
		ring.SetReport(digest)
	}
}

func (k *ringKeeper) announceTip(hash string) {
	k.mu.Lock()
	k.meta.Tip = hash
	ring := k.ring
	k.mu.Unlock()
	if ring != nil {
		ring.SetTip(hash)
	}
}

// send sends a direct message to a member (gossip.Ring.Send): it blocks
// up to the ring's TCP timeout, so it never runs on the loop.
func (k *ringKeeper) send(to, kind string, body []byte) error {
	k.mu.Lock()
	ring := k.ring
	k.mu.Unlock()
	if ring == nil {
		return fmt.Errorf("message to %s: this node is in no gossip ring", to)
	}
	return ring.Send(to, kind, body)
}

// members returns the ring's view, and whether this node is in a ring.
func (k *ringKeeper) members() (gossip.View, bool) {
	k.mu.Lock()
	ring := k.ring
	k.mu.Unlock()
	if ring == nil {
		return gossip.View{}, false
	}
	return ring.View(), true
}

// view returns the ring as this node sees it now, its times moved by
// offset (the cluster clock's lead on this node's clock), or nil when this
// node is in no ring and none of its rings ever saw a node alive. Out of a
// ring, the view holds only when a ring last saw each node (Seen).
func (k *ringKeeper) view(offset time.Duration) (*planner.Gossip, gossip.View) {
	k.mu.Lock()
	ring := k.ring
	k.mu.Unlock()
	var v gossip.View
	if ring != nil {
		v = ring.View()
	}
	now := k.now()
	k.mu.Lock()
	for name, m := range v.Members {
		if m.Alive {
			k.seen[name] = now
		}
	}
	seen := maps.Clone(k.seen)
	k.mu.Unlock()
	if ring == nil && len(seen) == 0 {
		return nil, v
	}
	shift := func(t time.Time) time.Time {
		if t.IsZero() {
			return t
		}
		return t.Add(offset)
	}
	g := &planner.Gossip{Seen: make(map[string]time.Time, len(seen))}
	for name, t := range seen {
		g.Seen[name] = shift(t)
	}
	if ring == nil {
		return g, v
	}
	g.Members = make(map[string]planner.Member, len(v.Members))
	alive, dead := 0, 0
	for name, m := range v.Members {
		g.Members[name] = planner.Member{Alive: m.Alive, Since: shift(m.Since), Rejoined: shift(m.Rejoined)}
		if m.Alive {
			alive++
		} else {
			dead++
		}
	}
	k.metrics.GossipMembers.WithLabelValues("alive").Set(float64(alive))
	k.metrics.GossipMembers.WithLabelValues("dead").Set(float64(dead))
	return g, v
}

// heartbeat is the interval between two pushes of an unchanged report:
// the cluster's reportInterval, or, while this node sees no majority of
// the ring (it may be the one cut off, and the others then judge it by
// its reports), the shorter of that and the default report interval of a
// cluster without gossip.
func heartbeat(c render.Cluster, minority bool) time.Duration {
	interval := time.Duration(cmp.Or(c.ReportInterval, render.DefaultReportInterval))
	if minority {
		interval = min(interval, time.Duration(render.DefaultReportInterval))
	}
	return interval
}
