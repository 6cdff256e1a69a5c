package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"regexp"
	"time"

	"github.com/hashicorp/memberlist"
)

// Message is what one member sends another directly (Send), over the
// ring's TCP stream: encrypted and authenticated with the ring's keys like
// all of its traffic, so only a member can send one. From is the sender's
// node name as the sender wrote it: the ring's key vouches for a member,
// not for which member, so a body that matters carries its own proof (the
// agents send signed reports).
type Message struct {
	From string
	Kind string
	Body []byte
}

// MaxMessage bounds a message's body: a signed report at its largest
// (sync.MaxReportSize and the signature) fits.
const MaxMessage = 5 << 20

// messageBuffer is how many received messages wait for the receiver before
// more are dropped (memberlist's receiving goroutine never blocks).
const messageBuffer = 64

// messagePrefix versions the messages' encoding: "keelmsg1 <kind> <from>\n<body>".
const messagePrefix = "keelmsg1"

// wordRE is what a kind or a sender's name may be: a node name is a DNS
// label (render checks it), a kind a lower-case word.
var wordRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func encodeMessage(m Message) ([]byte, error) {
	if !wordRE.MatchString(m.Kind) || !wordRE.MatchString(m.From) {
		return nil, fmt.Errorf("message kind %q from %q: not words", m.Kind, m.From)
	}
	if len(m.Body) > MaxMessage {
		return nil, fmt.Errorf("message of %d bytes: more than %d", len(m.Body), MaxMessage)
	}
	b := make([]byte, 0, len(messagePrefix)+len(m.Kind)+len(m.From)+3+len(m.Body))
	b = append(b, messagePrefix+" "+m.Kind+" "+m.From+"\n"...)
	return append(b, m.Body...), nil
}

// parseMessage reads a received message; what does not parse is dropped.
func parseMessage(b []byte) (Message, bool) {
	head, body, ok := bytes.Cut(b, []byte{'\n'})
	if !ok || len(body) > MaxMessage {
		return Message{}, false
	}
	f := bytes.Fields(head)
	if len(f) != 3 || string(f[0]) != messagePrefix || !wordRE.Match(f[1]) || !wordRE.Match(f[2]) {
		return Message{}, false
	}
	return Message{Kind: string(f[1]), From: string(f[2]), Body: bytes.Clone(body)}, true
}

// deadlineTransport is memberlist's TCP and UDP transport, with a
// deadline on each connection it dials: memberlist bounds the dial of a
// direct message by its TCP timeout but not the writes, so a peer that
// stops reading (frozen, or its buffers full) would hold the sender for
// good.
type deadlineTransport struct {
	*memberlist.NetTransport
	timeout time.Duration
}

func (t *deadlineTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	conn, err := t.NetTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	if err := conn.SetDeadline(time.Now().Add(max(timeout, t.timeout))); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

func (t *deadlineTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// ErrNotMember is Send's error for a node the ring does not hold alive.
var ErrNotMember = errors.New("not an alive member of the ring")

// Send sends a message of kind with body to the member named to, over TCP
// (memberlist's reliable stream). It blocks until the message is written
// or the ring's TCP timeout (10 s by default) passes, dial and writes
// together: call it off any loop that must not wait. Only an inventory node the ring holds alive, at its inventory
// address, is sent to.
func (r *Ring) Send(to, kind string, body []byte) error {
	b, err := encodeMessage(Message{From: r.cfg.Node, Kind: kind, Body: body})
	if err != nil {
		return err
	}
	r.mu.Lock()
	at, listed := r.peers[to]
	alive := r.members[to].Alive
	r.mu.Unlock()
	if !listed || !alive || to == r.cfg.Node {
		return fmt.Errorf("gossip message to %s: %w", to, ErrNotMember)
	}
	// The member's inventory address, the only one it is admitted at
	// (memberlist's own Node may be rewritten while it is read).
	n := &memberlist.Node{Name: to, Addr: at.Addr().AsSlice(), Port: at.Port()}
	if err := r.ml.SendReliable(n, b); err != nil {
		return fmt.Errorf("gossip message to %s: %w", to, err)
	}
	return nil
}

// Messages delivers the messages the members send this node: from
// inventory nodes other than this one, well formed, at most MaxMessage
// bytes of body. When the receiver falls behind by messageBuffer
// messages, the newer ones are dropped (the senders repeat what matters).
func (r *Ring) Messages() <-chan Message { return r.messages }

// NotifyMsg is memberlist's hand-off of a received message: it must not
// block, and the slice is reused after it returns.
func (d *delegate) NotifyMsg(b []byte) {
	r := (*Ring)(d)
	m, ok := parseMessage(b)
	if !ok {
		r.log.Debug("dropped a gossip message that does not parse", "bytes", len(b))
		return
	}
	r.mu.Lock()
	_, listed := r.peers[m.From]
	r.mu.Unlock()
	if !listed || m.From == r.cfg.Node {
		r.log.Debug("dropped a gossip message from a node not in the inventory", "from", m.From)
		return
	}
	select {
	case r.messages <- m:
	default:
		r.log.Debug("dropped a gossip message: the receiver is behind", "from", m.From, "kind", m.Kind)
	}
}
