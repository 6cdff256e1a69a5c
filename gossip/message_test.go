package gossip

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func TestMessages(t *testing.T) {
	rings := startRings(t, []string{"a", "b", "c"}, nil, "a", "b")
	waitView(t, rings["a"], "a and b alive", func(v View) bool { return aliveSet(v) == "a,b" })
	waitView(t, rings["b"], "a and b alive", func(v View) bool { return aliveSet(v) == "a,b" })
	body := bytes.Repeat([]byte("report\n"), 100_000) // 700 kB: more than a UDP packet
	if err := rings["a"].Send("b", "report", body); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-rings["b"].Messages():
		if m.From != "a" || m.Kind != "report" || !bytes.Equal(m.Body, body) {
			t.Errorf("got %s/%s of %d bytes", m.From, m.Kind, len(m.Body))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b never got a's message")
	}
	// c is in the inventory but not alive; d not in it; a is the sender.
	for _, to := range []string{"c", "d", "a"} {
		if err := rings["a"].Send(to, "report", nil); !errors.Is(err, ErrNotMember) {
			t.Errorf("send to %s: %v, want ErrNotMember", to, err)
		}
	}
	if err := rings["a"].Send("b", "Not A Word", nil); err == nil {
		t.Error("a kind that is not a word was sent")
	}
	if err := rings["a"].Send("b", "report", make([]byte, MaxMessage+1)); err == nil {
		t.Error("a body over MaxMessage was sent")
	}
}

func TestNotifyMsgDropsWhatIsNotFromAMember(t *testing.T) {
	rings := startRings(t, []string{"a", "b"}, nil, "a")
	d := (*delegate)(rings["a"].Ring)
	for _, b := range [][]byte{
		[]byte("keelmsg1 report b"),          // no body line
		[]byte("keelmsg2 report b\nx"),       // another version
		[]byte("keelmsg1 report zz\nx"),      // not in the inventory
		[]byte("keelmsg1 report a\nx"),       // from itself
		[]byte("keelmsg1 Report b\nx"),       // not a word
		[]byte("keelmsg1 report b extra\nx"), // too many fields
		append([]byte("keelmsg1 report b\n"), make([]byte, MaxMessage+1)...),
	} {
		d.NotifyMsg(b)
	}
	good := []byte("keelmsg1 ack b\nbody")
	d.NotifyMsg(good)
	good[len(good)-1] = 'X' // memberlist reuses its buffer
	select {
	case m := <-rings["a"].Messages():
		if m.From != "b" || m.Kind != "ack" || string(m.Body) != "body" {
			t.Errorf("got %+v", m)
		}
	default:
		t.Fatal("the good message was dropped")
	}
	select {
	case m := <-rings["a"].Messages():
		t.Errorf("a bad message got through: %+v", m)
	default:
	}
	// A receiver that falls behind loses the newer messages, never blocks
	// memberlist.
	for range messageBuffer + 10 {
		d.NotifyMsg([]byte("keelmsg1 ack b\n"))
	}
	if n := len(rings["a"].Messages()); n != messageBuffer {
		t.Errorf("%d messages buffered, want %d", n, messageBuffer)
	}
}
