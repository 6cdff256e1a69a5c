package ingress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"
)

// slowClient is a connection from a given loopback address that never
// finishes its request: silent (a TLS client that never says hello) or
// trickling a header byte every 50 ms (an HTTP slowloris).
type slowClient struct {
	c      net.Conn
	closed chan error // the error that ended the first read
	opened time.Time
}

func dialSlow(t *testing.T, from string, to net.Addr, trickle bool) *slowClient {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", to.String())
	if err != nil {
		t.Fatal(err)
	}
	sc := &slowClient{c: c, closed: make(chan error, 1), opened: time.Now()}
	var wg sync.WaitGroup
	t.Cleanup(func() { c.Close(); wg.Wait() })
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	wg.Go(func() {
		_, err := c.Read(make([]byte, 1))
		if err == nil {
			err = errors.New("read a byte")
		}
		sc.closed <- err
	})
	if trickle {
		wg.Go(func() {
			if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: web.test\r\nX-Slow: "); err != nil {
				return
			}
			for {
				if _, err := io.WriteString(c, "a"); err != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	return sc
}

// closedByServer waits until the server closed sc, and fails t if the read
// ended otherwise (the test's own deadline, or a byte).
func (sc *slowClient) closedByServer(t *testing.T) time.Duration {
	t.Helper()
	err := <-sc.closed
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) || err.Error() == "read a byte" {
		t.Fatalf("a slow client was not closed by the server: %v", err)
	}
	return time.Since(sc.opened)
}

// One client address opening many connections that send nothing holds at
// most a quarter of a listener's slots: its other connections are closed
// at once, and other clients are served while it holds its quarter.
func TestSlowClientsFromOneAddress(t *testing.T) {
	checkLeaks(t)
	a := newBackend(t, "a", nil)
	// A header timeout far longer than the test: only the per-address
	// bound can let the normal client in.
	s := newServer(t, Options{Certs: newCertStore(t, "web.test"), Limits: Limits{MaxConns: 8, HeaderTimeout: time.Hour}})
	if err := s.SetRoutes([]Route{{Host: "web.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{a.addr()}}}); err != nil {
		t.Fatal(err)
	}
	var slow []*slowClient
	for range 20 {
		slow = append(slow, dialSlow(t, "127.0.0.2", s.HTTPSAddr(), false))
		slow = append(slow, dialSlow(t, "127.0.0.2", s.HTTPAddr(), true))
	}
	// Each listener keeps 2 (a quarter of 8) of the address's 20.
	closedNow := func() int {
		n := 0
		for _, sc := range slow {
			select {
			case err := <-sc.closed:
				sc.closed <- err
				n++
			default:
			}
		}
		return n
	}
	waitFor(t, "the slow address's extra connections to be closed", func() bool { return closedNow() == 36 })
	c := newClient(t, s, true)
	if code, body := get(t, c, "https://web.test/"); code != 200 || field(body, "backend") != "a" {
		t.Fatalf("a normal client got %d %q while one address held its quarter", code, body)
	}
	if code, _ := get(t, c, "http://web.test/"); code != 308 {
		t.Fatalf("a normal client got %d on the HTTP listener", code)
	}
	if n := closedNow(); n != 36 {
		t.Fatalf("%d slow connections closed; want the 4 held ones still open while the normal client was served", n)
	}
	for _, sc := range slow {
		select {
		case err := <-sc.closed:
			sc.closed <- err
			sc.closedByServer(t) // checks how it ended
		default:
		}
	}
}

// Slow clients from many addresses fill every slot: each is closed when
// the header timeout (which covers the TLS handshake) expires, and a
// normal client waiting in the kernel's queue is then served.
func TestSlowClientsFromManyAddresses(t *testing.T) {
	checkLeaks(t)
	a := newBackend(t, "a", nil)
	const timeout = time.Second
	s := newServer(t, Options{Certs: newCertStore(t, "web.test"), Limits: Limits{MaxConns: 8, HeaderTimeout: timeout}})
	if err := s.SetRoutes([]Route{{Host: "web.test", Path: "/", Service: "web", Endpoints: []netip.AddrPort{a.addr()}}}); err != nil {
		t.Fatal(err)
	}
	var slow []*slowClient
	for i := range 8 {
		from := fmt.Sprintf("127.0.1.%d", 10+i)
		slow = append(slow, dialSlow(t, from, s.HTTPSAddr(), false), dialSlow(t, from, s.HTTPAddr(), true))
	}
	waitFor(t, "every slot to be taken", func() bool { return s.conns.len() == 16 })
	c := newClient(t, s, true)
	if code, body := get(t, c, "https://web.test/"); code != 200 || field(body, "backend") != "a" {
		t.Fatalf("a normal client got %d %q", code, body)
	}
	for _, sc := range slow {
		if took := sc.closedByServer(t); took < timeout/2 {
			t.Errorf("a slow client was closed after %s, before the header timeout %s", took, timeout)
		}
	}
}
