package netlimit

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// The listener holds at most n connections: the next is accepted only
// once one of them is closed.
func TestListenerHoldsAtMostN(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Listener(raw, 2)
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first := <-accepted
	<-accepted
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted with a limit of 2")
	case <-time.After(200 * time.Millisecond):
	}
	first.Close()
	first.Close() // a second Close gives back nothing more
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(30 * time.Second):
		t.Fatal("the third connection was not accepted once a slot was free")
	}
	l.Close()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Accept did not return after Close")
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

// One client host holds at most a quarter of the slots: its next
// connection is closed at once, while another host's is accepted
// (slowloris from one address locks nobody out).
func TestListenerSharesSlotsAmongHosts(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Listener(raw, 8) // 2 per host
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func(from string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for range 2 {
		dial("127.0.0.1")
		<-accepted
	}
	third := dial("127.0.0.1")
	third.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := third.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a host's third connection was not closed with 2 per host: %v", err)
	}
	dial("127.0.0.2")
	select {
	case c := <-accepted:
		if h := hostOf(c.RemoteAddr()); h != "127.0.0.2" {
			t.Fatalf("accepted a connection of %s, want 127.0.0.2", h)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("another host's connection was not accepted while one host held its share")
	}
}

// A keep-alive connection that sends no next request is closed after the
// idle timeout, and one that sends no header after the header timeout.
func TestServerClosesIdleAndSilentConnections(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := HTTP{MaxConns: 4, HeaderTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond}
	srv, served := h.Serve(raw, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	defer func() {
		srv.Close()
		<-served
	}()
	closedWithin := func(c net.Conn, r *bufio.Reader) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := r.ReadByte()
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the server kept the connection: %v", err)
		}
	}
	idle, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	idle.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	r := bufio.NewReader(idle)
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	resp.Body.Close()
	closedWithin(idle, r)

	silent, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	closedWithin(silent, bufio.NewReader(silent))

	big, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	big.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 2*MaxHeaderBytes) + "\r\n\r\n"))
	resp, err = http.ReadResponse(bufio.NewReader(big), nil)
	if err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("a request with headers over the limit: %v %v", resp, err)
	}
}

func TestBudget(t *testing.T) {
	b := Budget{Reserve: 256}
	b.Add("--metrics-max-conns", 64)
	b.Add("2 × --proxy-max-conns", 4096)
	if b.Total() != 4416 {
		t.Fatalf("total %d", b.Total())
	}
	if err := b.CheckAgainst(4416); err != nil {
		t.Fatal(err)
	}
	err := b.CheckAgainst(1024)
	if err == nil || !strings.Contains(err.Error(), "2 × --proxy-max-conns 4096") || !strings.Contains(err.Error(), "256 kept") {
		t.Fatalf("want a refusal naming every use, got %v", err)
	}
}
