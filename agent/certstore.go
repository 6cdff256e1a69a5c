package agent

import (
	"crypto/tls"
	"maps"
	gosync "sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keel-dev/keel/providers"
)

// certStore holds what the ingress serves from outside the plan: a
// certificate per host and the answers to ACME HTTP-01 challenges. The
// ingress reads it on every TLS handshake and challenge request, from its
// own goroutines; the loop, the ACME manager and the git worker write it.
// It is safe for concurrent use.
type certStore struct {
	mu    gosync.RWMutex
	certs map[string]servedCert
	// shared are the answers the hosts' issuers published (replaced at
	// each fetch); own are those of this node's orders in progress.
	shared, own map[string]string
}

// servedCert is a bundle with its parsed form, parsed once.
type servedCert struct {
	bundle *providers.Bundle
	tls    *tls.Certificate
}

func newCertStore() *certStore {
	return &certStore{certs: map[string]servedCert{}, shared: map[string]string{}, own: map[string]string{}}
}

// Certificate returns the certificate to serve for host, or nil.
func (s *certStore) Certificate(host string) *tls.Certificate {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.certs[host].tls
}

// Bundle returns the bundle served for host, or nil.
func (s *certStore) Bundle(host string) *providers.Bundle {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.certs[host].bundle
}

// Bundles returns every bundle served, by host.
func (s *certStore) Bundles() map[string]*providers.Bundle {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]*providers.Bundle, len(s.certs))
	for h, c := range s.certs {
		out[h] = c.bundle
	}
	return out
}

// Put serves b for its host, in place of the one served. Which one to
// serve is the caller's choice (ingressState.serveShared, onIssued): not
// "the later expiry wins", which a certificate of a compromised node's
// making, valid for a century, would always win.
func (s *certStore) Put(b *providers.Bundle) error {
	c, err := b.TLSCertificate()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.certs[b.Host] = servedCert{bundle: b, tls: c}
	return nil
}

// Withdraw stops serving host's certificate if its serial is serial,
// and reports whether it did.
func (s *certStore) Withdraw(host, serial string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.certs[host]; ok && c.bundle.Serial == serial {
		delete(s.certs, host)
		return true
	}
	return false
}

// Retain forgets the certificates of the hosts keep does not hold.
func (s *certStore) Retain(keep func(host string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	maps.DeleteFunc(s.certs, func(h string, _ servedCert) bool { return !keep(h) })
}

// expiryDesc describes keel_certificate_expiry_timestamp_seconds.
var expiryDesc = prometheus.NewDesc("keel_certificate_expiry_timestamp_seconds",
	"When the certificate this node serves for a host expires, in Unix seconds.", []string{"host"}, nil)

// Describe and Collect export the expiry of every certificate served,
// whoever obtained it: a series per host served, gone with the host.
func (s *certStore) Describe(ch chan<- *prometheus.Desc) { ch <- expiryDesc }

func (s *certStore) Collect(ch chan<- prometheus.Metric) {
	for host, b := range s.Bundles() {
		ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, float64(b.NotAfter.Unix()), host)
	}
}

// KeyAuthorization answers an ACME HTTP-01 challenge: this node's own
// orders first, then those the hosts' issuers published.
func (s *certStore) KeyAuthorization(token string) (string, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if ka, ok := s.own[token]; ok {
		return ka, true
	}
	ka, ok := s.shared[token]
	return ka, ok
}

// SetShared replaces the answers published by the hosts' issuers.
func (s *certStore) SetShared(answers map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shared = maps.Clone(answers)
}

// Answer adds (keyAuth non-empty) or removes the answer to one of this
// node's own challenges.
func (s *certStore) Answer(token, keyAuth string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if keyAuth == "" {
		delete(s.own, token)
		return
	}
	s.own[token] = keyAuth
}
