package ingress

import (
	"math/rand/v2"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Concurrent clients, over HTTP/2 and HTTP/1.1, while the endpoint lists
// are swapped again and again (each list holding at least one live
// endpoint, and at most one dead): not one request fails, and every live
// endpoint serves some.
func TestHotSwapUnderLoad(t *testing.T) {
	checkLeaks(t)
	// Backends that take a little while, so that swaps land while
	// requests are in flight.
	var live []*backend
	for _, name := range []string{"a", "b", "c", "d"} {
		var b *backend
		b = newBackend(t, name, func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
			b.echo(w, r)
		})
		live = append(live, b)
	}
	dead := deadAddr(t)
	s := newServer(t, Options{Certs: newCertStore(t, "web.test", "api.test")})
	routesFor := func(rng *rand.Rand) []Route {
		var eps []netip.AddrPort
		for _, i := range rng.Perm(len(live))[:1+rng.IntN(len(live))] {
			eps = append(eps, live[i].addr())
		}
		if rng.IntN(2) == 0 {
			eps = append(eps, dead)
			rng.Shuffle(len(eps), func(i, j int) { eps[i], eps[j] = eps[j], eps[i] })
		}
		routes := []Route{
			{Host: "web.test", Path: "/", Service: "web", Endpoints: eps},
			{Host: "api.test", Path: "/", Service: "api", Endpoints: eps},
		}
		if rng.IntN(2) == 0 { // a route that comes and goes, for the same host
			routes = append(routes, Route{Host: "web.test", Path: "/extra", Service: "extra", Endpoints: eps})
		}
		return routes
	}
	seed := rand.New(rand.NewPCG(1, 2))
	if err := s.SetRoutes(routesFor(seed)); err != nil {
		t.Fatal(err)
	}

	const workers, perWorker = 8, 150
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range workers {
		c := newClient(t, s, w%2 == 0)
		host := []string{"web.test", "api.test"}[(w/2)%2]
		wg.Go(func() {
			for range perWorker {
				res, body, err := do(c, "https://"+host+"/x")
				if err != nil || res.StatusCode != 200 || field(body, "backend") == "" {
					failed.Add(1)
					if err == nil {
						err = errString(res.Status + " " + body)
					}
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	var swaps atomic.Int64
	var swapper sync.WaitGroup
	swapper.Go(func() {
		rng := rand.New(rand.NewPCG(3, 4))
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := s.SetRoutes(routesFor(rng)); err != nil {
				t.Error(err)
				return
			}
			swaps.Add(1)
			time.Sleep(200 * time.Microsecond)
		}
	})
	wg.Wait()
	close(stop)
	swapper.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed during %d swaps; first: %v", n, workers*perWorker, swaps.Load(), firstErr.Load())
	}
	if swaps.Load() < 10 {
		t.Fatalf("only %d swaps happened during the load", swaps.Load())
	}
	for _, b := range live {
		if b.requests.Load() == 0 {
			t.Errorf("backend %s got no request", b.name)
		}
	}
	t.Logf("%d requests, %d swaps, no failure", workers*perWorker, swaps.Load())
}

type errString string

func (e errString) Error() string { return string(e) }
