package dns01

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	legodns01 "github.com/go-acme/lego/v5/challenge/dns01"
	legolog "github.com/go-acme/lego/v5/log"
	"github.com/go-acme/lego/v5/providers/dns/cloudflare"
	"github.com/go-acme/lego/v5/providers/dns/ovh"
)

// httpTimeout bounds one request to a provider's API.
const httpTimeout = 30 * time.Second

// legoProvider is what lego's DNS providers implement. Their token
// argument only keys the record IDs they remember between Present and
// CleanUp; the key authorization (unique per challenge) serves.
type legoProvider interface {
	Present(ctx context.Context, domain, token, keyAuth string) error
	CleanUp(ctx context.Context, domain, token, keyAuth string) error
}

// lego adapts one of lego's providers. Only its API calls run: lego's own
// propagation check belongs to its challenge solver, which Keel does not
// use, so the check that runs is this package's (resolver.wait).
type lego struct{ p legoProvider }

func (l lego) present(ctx context.Context, ch *challenge) error {
	return l.p.Present(ctx, ch.domain, ch.keyAuth, ch.keyAuth)
}

func (l lego) cleanup(ctx context.Context, ch *challenge) error {
	return l.p.CleanUp(ctx, ch.domain, ch.keyAuth, ch.keyAuth)
}

// useResolvers points lego at the configured resolvers. lego finds the
// zone and follows CNAMEs through a process-wide client (its
// dns01.DefaultClient), so this is process-wide too: the agent loads one
// DNS provider, and its resolvers are the ones this package uses itself.
//
// lego's logger (also process-wide) writes to stdout, around Keel's
// logging; what it says on these paths (a CNAME followed) is in this
// package's errors anyway, so it is silenced.
func useResolvers(servers []string) {
	legodns01.SetDefaultClient(legodns01.NewClient(&legodns01.Options{
		RecursiveNameservers: servers,
		Timeout:              exchangeTimeout,
	}))
	legolog.SetDefault(slog.New(slog.DiscardHandler))
}

// newHTTPClient returns the client a lego provider gets, and a function
// that undoes what lego may have done to it: lego wraps the transport in a
// request dumper when LEGO_DEBUG_DNS_API_HTTP_CLIENT is set in the
// environment, and the OVH dump would print the consumer key.
func newHTTPClient() (*http.Client, func()) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	hc := &http.Client{Timeout: httpTimeout, Transport: tr}
	return hc, func() { hc.Transport = tr }
}

// newOVH builds lego's OVH provider from the file's settings (never from
// OVH_* variables: lego's env-reading constructor is not called, and every
// field go-ovh would look up in the environment or in ovh.conf files is
// set, except the other authentication methods').
func newOVH(c *config) (lego, error) {
	hc, restore := newHTTPClient()
	p, err := ovh.NewDNSProviderConfig(&ovh.Config{
		APIEndpoint:       c.Endpoint,
		ApplicationKey:    c.ApplicationKey,
		ApplicationSecret: c.ApplicationSecret,
		ConsumerKey:       c.ConsumerKey,
		TTL:               c.TTL,
		// Not used by Present/CleanUp; set so that nothing is zero.
		PropagationTimeout: c.PropagationTimeout,
		PollingInterval:    c.PropagationInterval,
		HTTPClient:         hc,
	})
	restore()
	if err != nil {
		return lego{}, err
	}
	useResolvers(c.Resolvers)
	return lego{p}, nil
}

// newCloudflare builds lego's Cloudflare provider with an API token.
func newCloudflare(c *config) (lego, error) {
	hc, restore := newHTTPClient()
	p, err := cloudflare.NewDNSProviderConfig(&cloudflare.Config{
		AuthToken:          c.APIToken,
		BaseURL:            c.Endpoint,
		TTL:                c.TTL,
		PropagationTimeout: c.PropagationTimeout,
		PollingInterval:    c.PropagationInterval,
		HTTPClient:         hc,
	})
	restore()
	if err != nil {
		return lego{}, err
	}
	useResolvers(c.Resolvers)
	return lego{p}, nil
}
