package agent

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	gosync "sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/keel-dev/keel/gossip"
	"github.com/keel-dev/keel/planner"
	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/report"
	"github.com/keel-dev/keel/sync"
)

// The drain acknowledgements' messages on the gossip ring.
const (
	// askKind asks a node for its newest report, now and at every change
	// of its content for subscribeFor.
	askKind = "drain-ask"
	// ackKind is a node's newest report, signed as it signs those it
	// pushes: "<signature length>\n<signature><report>".
	ackKind = "drain-ack"
)

const (
	// subscribeFor is how long an ask makes a node send its changed
	// reports to the asker: longer than a drain lasts at most
	// (nodeexec.DefaultDrainTimeout).
	subscribeFor = 15 * time.Second
	// askEvery is how often a node that a drain still waits for is asked
	// again (a message lost, a node restarted since its last ask).
	askEvery = time.Second
	// ackTTL is how long a report received over the ring counts: by then
	// its node has pushed it (ringPushMax) and a fetch has brought it
	// (ackCover, ackRecheckEvery), or a newer one came. A report that
	// stopped coming (the node's clock stepped back, it left the ring)
	// does not outlive it.
	ackTTL = 10 * time.Second
	// ackSenders is how many messages are sent at once; ackQueue how many
	// wait (more are dropped: asks are repeated, changes sent again).
	ackSenders = 4
	ackQueue   = 1024
	// ackCover is how long a content received over the ring, or replaced
	// by a newer one, keeps git's copy of it from being fetched (has):
	// half of ackTTL, so that git's copy is read (ackRecheckEvery) before the
	// ring's report stops counting, whatever the ring brings meanwhile.
	ackCover = ackTTL / 2
	// ackRecheckEvery is how often the loop looks for what a fetch should
	// bring while ring reports count (holding).
	ackRecheckEvery = time.Second
	// pastDigests bounds the replaced digests kept a node (has): a
	// rollout step changes a report a few times, a burst held back from
	// git a few dozen at most.
	pastDigests = 32
)

// drainAckEvents are the values of keel_drain_ack_messages_total's event.
var drainAckEvents = []string{"asked", "answered", "received", "rejected", "send_failed"}

// drainAcks carries drain acknowledgements over the gossip ring, so that
// a drain or a rollout step does not wait for its peers' reports to go
// through git (a push and a fetch, each way): a node whose instance waits
// to drain asks the nodes whose newest reports still send it connections,
// and a node that runs a replica of a Service in a rollout the nodes of
// the replicas the rollout waits for (ask); each
// answers with its newest report, signed with its report key, at once and
// again at every change of its content for subscribeFor (offer). The
// reports it receives are checked as those read from git are
// (sync.VerifiedReport: bounded, signed by the node's report key when it
// has one, parsed strictly) and the planner counts each node's newest
// report, from git or from here (withAcks). Only the reports of nodes
// with a reportKey, signed, asked for within subscribeFor, count, each for
// ackTTL: the ring's key vouches for a member, not for which one. Without
// a ring, nothing is asked and the plans read git alone.
//
// Its goroutines (a receiver and ackSenders senders) are stopped and
// waited for by close; the loop calls offer, ask, acks and setKeys (which
// do nothing on a nil drainAcks: an agent not running), and learns of a
// report that may end a drain on arrived.
type drainAcks struct {
	signer  ssh.Signer
	ring    *ringKeeper
	log     *slog.Logger
	metrics *Metrics

	mu  gosync.Mutex
	own *report.Report // the newest report the loop built
	// ownDigest is own's content (report.ContentDigest); signed is own,
	// signed and encoded, once a sender needed it.
	ownDigest string
	signed    struct {
		of   *report.Report
		body []byte
	}
	subs   map[string]time.Time // node → until when it asked for this node's changes
	asked  map[string]time.Time // node → when this node last asked it
	keys   sync.ReportKeys
	nodes  map[string]bool // the inventory
	got    map[string]report.Report
	digest map[string]string // report.ContentDigest of got's
	// past are the digests of the reports got replaced, oldest first (at
	// most pastDigests a node), with when each was replaced: git's copy
	// of one replaced within ackCover is no news (has).
	past map[string][]replaced
	// limit is the latest date of a ring report the last plan counted
	// (withAcks' limit); zero: none counted.
	limit time.Time
	gotAt map[string]time.Time // when each of got came: it counts for ackTTL
	// refused is the last reason a node's report was refused, logged
	// once as a warning (then at debug level while it stays the same).
	refused map[string]string
	queued  map[string]bool // "kind to": a message waiting for a sender

	queue   chan [2]string // kind, to
	arrived chan struct{}
	stop    chan struct{}
	wg      gosync.WaitGroup
}

func newDrainAcks(signer ssh.Signer, ring *ringKeeper, log *slog.Logger, metrics *Metrics) *drainAcks {
	d := &drainAcks{
		signer: signer, ring: ring, log: log, metrics: metrics,
		subs: map[string]time.Time{}, asked: map[string]time.Time{},
		nodes: map[string]bool{}, got: map[string]report.Report{}, digest: map[string]string{}, past: map[string][]replaced{}, gotAt: map[string]time.Time{}, refused: map[string]string{}, queued: map[string]bool{},
		queue: make(chan [2]string, ackQueue), arrived: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	for _, e := range drainAckEvents {
		metrics.DrainAcks.WithLabelValues(e)
	}
	d.wg.Add(1 + ackSenders)
	go func() {
		defer d.wg.Done()
		d.receive()
	}()
	for range ackSenders {
		go func() {
			defer d.wg.Done()
			d.send()
		}()
	}
	return d
}

// close stops the goroutines and waits for them: a send under way ends
// within the ring's TCP timeout (dial and writes, gossip.Send).
func (d *drainAcks) close() {
	close(d.stop)
	d.wg.Wait()
}

// setKeys takes the applied commit's inventory and report keys: reports
// of the nodes with a key count only when signed by it, and what is kept
// of nodes that left the inventory is dropped.
func (d *drainAcks) setKeys(keys sync.ReportKeys, m *render.Model) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !sameKeys(d.keys, keys) {
		// A report taken under a key that is gone must not count.
		clear(d.got)
		clear(d.digest)
		clear(d.past)
		clear(d.gotAt)
	}
	d.keys = keys
	d.nodes = make(map[string]bool, len(m.Nodes))
	for _, n := range m.Nodes {
		d.nodes[n.Name] = true
	}
	for _, m := range []map[string]time.Time{d.subs, d.asked} {
		maps.DeleteFunc(m, func(n string, _ time.Time) bool { return !d.nodes[n] })
	}
	maps.DeleteFunc(d.got, func(n string, _ report.Report) bool { return !d.nodes[n] })
	maps.DeleteFunc(d.digest, func(n string, _ string) bool { return !d.nodes[n] })
	maps.DeleteFunc(d.past, func(n string, _ []replaced) bool { return !d.nodes[n] })
	maps.DeleteFunc(d.gotAt, func(n string, _ time.Time) bool { return !d.nodes[n] })
}

// offer takes the newest report the loop built, with its content digest:
// the nodes that asked within subscribeFor get it when its content
// changed. It never blocks.
func (d *drainAcks) offer(r report.Report, digest string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.own = &r
	if digest == d.ownDigest {
		return
	}
	d.ownDigest = digest
	now := time.Now()
	for _, n := range slices.Sorted(maps.Keys(d.subs)) {
		if now.After(d.subs[n]) {
			delete(d.subs, n)
			continue
		}
		d.enqueueLocked(ackKind, n)
	}
}

// ask asks the nodes a drain or a rollout step waits for
// (nodeexec.Result.DrainWaits, rolloutWaits) for their reports, each at
// most once every askEvery; a change in one of the reports that come then
// wakes the loop (arrived). Called after every pass (an empty list when
// nothing waits, or without a ring).
func (d *drainAcks) ask(nodes []string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	for _, n := range nodes {
		if d.keys[n] == nil {
			continue // its reports count from git only (take)
		}
		if now.Sub(d.asked[n]) >= askEvery {
			d.asked[n] = now
			d.log.Debug("asking a node for its report over the gossip ring", "to", n)
			d.enqueueLocked(askKind, n)
		}
	}
}

// acks returns the newest report received from each node within ackTTL,
// in node order.
func (d *drainAcks) acks() []report.Report {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]report.Report, 0, len(d.got))
	for _, n := range slices.Sorted(maps.Keys(d.got)) {
		if time.Since(d.gotAt[n]) <= ackTTL {
			out = append(out, d.got[n])
		}
	}
	return out
}

// replaced is a content digest of a node's report that a newer one
// replaced, and when.
type replaced struct {
	digest string
	at     time.Time
}

// has reports whether git's copy of node's report with content version
// digest (report.ContentDigest) would bring nothing newer than the ring
// has: the newest report received from node says the same, or replaced
// one that did, within ackCover, and the last plan counted it (limit).
// The ring announces a version once node pushed it; a node pushes a burst
// of changes once they settle (ringQuiet), so its push of a rollout
// step's last report often lands when the next step's reports have come
// over the ring already: without the replaced ones, every node would
// fetch it then, on the CPUs and the git server that step waits for.
// Past ackCover, git's copy is fetched (the loop looks every
// ackRecheckEvery) before the ring's report stops counting at ackTTL, so
// that the plan does not fall back to a copy older than git's. (A content that comes back, A then B
// then A again, with the second A's message lost, is taken from git
// ackCover after B replaced A at most: until then the plan counts B.)
func (d *drainAcks) has(node, digest string) bool {
	if d == nil || digest == "" {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if r, ok := d.got[node]; !ok || now.Sub(d.gotAt[node]) > ackCover || d.limit.IsZero() || r.Time.After(d.limit) {
		return false
	}
	if d.digest[node] == digest {
		return true
	}
	return slices.ContainsFunc(d.past[node], func(p replaced) bool { return p.digest == digest && now.Sub(p.at) <= ackCover })
}

// setLimit records the latest date of a ring report the plan counts
// (withAcks' limit), for has.
func (d *drainAcks) setLimit(limit time.Time) {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.limit = limit
	d.mu.Unlock()
}

// holding reports whether a report received over the ring still counts.
func (d *drainAcks) holding() bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, at := range d.gotAt {
		if time.Since(at) <= ackTTL {
			return true
		}
	}
	return false
}

func (d *drainAcks) enqueueLocked(kind, to string) {
	key := kind + " " + to
	if d.queued[key] {
		return // the message waiting sends the newest report
	}
	select {
	case d.queue <- [2]string{kind, to}:
		d.queued[key] = true
	default:
		d.log.Debug("drain acknowledgements: too many messages waiting; dropped one", "kind", kind, "to", to)
	}
}

// send sends the queued messages: an ack is the newest report when it is
// sent, signed once per report.
func (d *drainAcks) send() {
	for {
		var msg [2]string
		select {
		case <-d.stop:
			return
		case msg = <-d.queue:
		}
		kind, to := msg[0], msg[1]
		d.mu.Lock()
		delete(d.queued, kind+" "+to)
		d.mu.Unlock()
		var body []byte
		if kind == ackKind {
			var err error
			if body, err = d.signedOwn(); err != nil {
				d.log.Warn("drain acknowledgement: cannot sign this node's report", "err", err)
				continue
			}
			if body == nil {
				continue // no report built yet
			}
		}
		if err := d.ring.send(to, kind, body); err != nil {
			d.metrics.DrainAcks.WithLabelValues("send_failed").Inc()
			d.log.Debug("drain acknowledgement not sent", "kind", kind, "to", to, "err", err)
			continue
		}
		event := "asked"
		if kind == ackKind {
			event = "answered"
		}
		d.metrics.DrainAcks.WithLabelValues(event).Inc()
	}
}

// signedOwn returns the newest report, signed and encoded as an ack's
// body; nil before the loop built one.
func (d *drainAcks) signedOwn() ([]byte, error) {
	d.mu.Lock()
	own, cached := d.own, d.signed
	d.mu.Unlock()
	if own == nil {
		return nil, nil
	}
	if cached.of == own {
		return cached.body, nil
	}
	data := own.Marshal()
	var sig []byte
	if d.signer != nil {
		var err error
		if sig, err = sync.SignReport(data, d.signer); err != nil {
			return nil, err
		}
	}
	body := encodeAck(data, sig)
	d.mu.Lock()
	if d.own == own {
		d.signed.of, d.signed.body = own, body
	}
	d.mu.Unlock()
	return body, nil
}

func encodeAck(data, sig []byte) []byte {
	body := make([]byte, 0, len(data)+len(sig)+8)
	body = strconv.AppendInt(body, int64(len(sig)), 10)
	body = append(body, '\n')
	body = append(body, sig...)
	return append(body, data...)
}

func decodeAck(body []byte) (data, sig []byte, err error) {
	head, rest, ok := bytes.Cut(body, []byte{'\n'})
	if !ok || len(head) > 6 {
		return nil, nil, fmt.Errorf("no signature length")
	}
	n, err := strconv.Atoi(string(head))
	if err != nil || n < 0 || n > len(rest) || n > sync.MaxSignatureSize {
		return nil, nil, fmt.Errorf("signature length %q", head)
	}
	return rest[n:], rest[:n], nil
}

// receive takes the members' messages: an ask subscribes the asker and
// answers it; an ack is checked and kept when it is the sender's newest.
func (d *drainAcks) receive() {
	for {
		var m gossip.Message
		select {
		case <-d.stop:
			return
		case m = <-d.ring.messages:
		}
		switch m.Kind {
		case askKind:
			d.mu.Lock()
			// Unsigned, this node's reports would be refused (take).
			if d.nodes[m.From] && d.signer != nil {
				d.subs[m.From] = time.Now().Add(subscribeFor)
				d.enqueueLocked(ackKind, m.From)
			}
			d.mu.Unlock()
		case ackKind:
			d.take(m)
		default:
			d.log.Debug("gossip message of an unknown kind dropped", "kind", m.Kind, "from", m.From)
		}
	}
}

func (d *drainAcks) take(m gossip.Message) {
	d.mu.Lock()
	keys, listed, asked := d.keys, d.nodes[m.From], d.asked[m.From]
	d.mu.Unlock()
	r, err := func() (report.Report, error) {
		switch {
		case !listed:
			return report.Report{}, fmt.Errorf("not a node of the applied commit's inventory")
		case keys[m.From] == nil:
			// The ring's key vouches for a member, not for which one:
			// only a report signed with the node's own key speaks for it.
			return report.Report{}, fmt.Errorf("the node has no reportKey: its reports count from git only")
		case time.Since(asked) > subscribeFor:
			return report.Report{}, fmt.Errorf("not asked for within %s", subscribeFor)
		}
		data, sig, err := decodeAck(m.Body)
		if err != nil {
			return report.Report{}, err
		}
		return sync.VerifiedReport(data, sig, m.From, keys)
	}()
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.metrics.DrainAcks.WithLabelValues("rejected").Inc()
		level := slog.LevelWarn
		if d.refused[m.From] == err.Error() {
			level = slog.LevelDebug // said once already
		}
		d.refused[m.From] = err.Error()
		d.log.Log(context.Background(), level, "report over the gossip ring refused", "from", m.From, "err", err)
		return
	}
	delete(d.refused, m.From)
	if cur, ok := d.got[m.From]; ok && time.Since(d.gotAt[m.From]) <= ackTTL && !planner.Newer(&r, &cur) {
		return // older than the one held
	}
	digest := report.ContentDigest(r)
	news := digest != d.digest[m.From]
	now := time.Now()
	if prev := d.digest[m.From]; news && prev != "" {
		past := append(d.past[m.From], replaced{prev, now})
		d.past[m.From] = past[max(0, len(past)-pastDigests):]
	}
	d.got[m.From], d.digest[m.From], d.gotAt[m.From] = r, digest, now
	d.metrics.DrainAcks.WithLabelValues("received").Inc()
	d.log.Debug("report received over the gossip ring", "from", m.From, "time", r.Time, "news", news)
	if news {
		// A change from a node this node asked (take checks it) may
		// release a replica or end a drain, whichever this node waits for
		// now; the same content dated later (an answer to a repeated ask)
		// is no reason for a pass.
		select {
		case d.arrived <- struct{}{}:
		default:
		}
	}
}
