package dns01

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fakeCloudflare is Cloudflare's API v4 as far as zones and DNS records
// go, stateful, and strict about the documented authentication of an API
// token: "Authorization: Bearer <token>". Records are served by the
// zone's name servers as soon as they are created, as Cloudflare does.
type fakeCloudflare struct {
	token  string
	zoneID string
	zone   *testZone
	srv    *httptest.Server

	mu       stdsync.Mutex
	records  map[string]cfRecord
	rejected int
}

type cfRecord struct {
	ID      string `json:"id,omitempty"`
	Type    string `json:"type"`
	Name    string `json:"name"`
	Content string `json:"content"`
	TTL     int    `json:"ttl"`
}

func newFakeCloudflare(t *testing.T, z *testZone) *fakeCloudflare {
	f := &fakeCloudflare{token: "cf-api-token-9b1deb4d", zoneID: "023e105f4ecef8ad9ca31a8372d0c353", zone: z, records: map[string]cfRecord{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /client/v4/zones", f.auth(f.zones))
	mux.HandleFunc("POST /client/v4/zones/{zone}/dns_records", f.auth(f.create))
	mux.HandleFunc("DELETE /client/v4/zones/{zone}/dns_records/{id}", f.auth(f.delete))
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func cfReply(w http.ResponseWriter, status int, result any, errs ...string) {
	type cfErr struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	out := struct {
		Success bool    `json:"success"`
		Errors  []cfErr `json:"errors"`
		Result  any     `json:"result"`
	}{Success: len(errs) == 0, Errors: []cfErr{}, Result: result}
	for _, e := range errs {
		out.Errors = append(out.Errors, cfErr{Code: 10000, Message: e})
	}
	writeJSON(w, status, out)
}

func (f *fakeCloudflare) auth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+f.token {
			f.mu.Lock()
			f.rejected++
			f.mu.Unlock()
			cfReply(w, http.StatusForbidden, nil, "Authentication error")
			return
		}
		if z := r.PathValue("zone"); z != "" && z != f.zoneID {
			cfReply(w, http.StatusNotFound, nil, "Invalid zone identifier")
			return
		}
		next(w, r)
	}
}

func (f *fakeCloudflare) zones(w http.ResponseWriter, r *http.Request) {
	var result []map[string]string
	if name := r.URL.Query().Get("name"); name == strings.TrimSuffix(f.zone.origin, ".") {
		result = append(result, map[string]string{"id": f.zoneID, "name": name})
	}
	cfReply(w, http.StatusOK, result)
}

func (f *fakeCloudflare) create(w http.ResponseWriter, r *http.Request) {
	var rec cfRecord
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&rec); err != nil || rec.Type != "TXT" ||
		!dns.IsSubDomain(f.zone.origin, dns.CanonicalName(rec.Name)) {
		cfReply(w, http.StatusBadRequest, nil, "Invalid record")
		return
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	rec.ID = hex.EncodeToString(id)
	f.mu.Lock()
	f.records[rec.ID] = rec
	f.publish(rec.Name)
	f.mu.Unlock()
	cfReply(w, http.StatusOK, rec)
}

func (f *fakeCloudflare) delete(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec, ok := f.records[r.PathValue("id")]
	if !ok {
		cfReply(w, http.StatusNotFound, nil, "Record not found")
		return
	}
	delete(f.records, rec.ID)
	f.publish(rec.Name)
	cfReply(w, http.StatusOK, map[string]string{"id": rec.ID})
}

// publish makes the name servers serve the TXT records at name; the API
// takes TXT content quoted or not, the zone holds it unquoted.
func (f *fakeCloudflare) publish(name string) {
	var values []string
	for _, rec := range f.records {
		if rec.Type == "TXT" && rec.Name == name {
			values = append(values, strings.Trim(rec.Content, `"`))
		}
	}
	f.zone.setTXT(dns.CanonicalName(name), values)
}

func (f *fakeCloudflare) config(z *testZone, token string) string {
	return fmt.Sprintf("provider: cloudflare\nendpoint: %s/client/v4\napiToken: %s\n", f.srv.URL, token) +
		z.propagationSettings(30*time.Second)
}

// Cloudflare through lego's provider, against the fake API: the bearer
// token is accepted, both challenges of one name (a wildcard and its base
// domain) are served by both name servers, and each CleanUp deletes its
// own record only.
func TestCloudflare(t *testing.T) {
	z := newTestZone(t, "example.test", 2)
	f := newFakeCloudflare(t, z)
	p, err := Load(writeConfig(t, f.config(z, f.token)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	const name = "_acme-challenge.example.test."
	base, wild := "token-1.thumbprint", "token-2.thumbprint"
	if err := p.Present(ctx, "example.test", base); err != nil {
		t.Fatal(err)
	}
	if err := p.Present(ctx, "*.example.test", wild); err != nil {
		t.Fatal(err)
	}
	want := []string{RecordValue(base), RecordValue(wild)}
	slices.Sort(want)
	for i := range z.ns {
		if got := z.served(i, name); !slices.Equal(got, want) {
			t.Errorf("%s serves %q, want both challenges' values %q", z.ns[i].name, got, want)
		}
	}
	if err := p.CleanUp(ctx, "example.test", base); err != nil {
		t.Fatal(err)
	}
	if got, _ := z.txt(t, 0, name); !slices.Equal(got, []string{RecordValue(wild)}) {
		t.Errorf("after one CleanUp ns1 serves %q, want the other challenge's value only", got)
	}
	if err := p.CleanUp(ctx, "*.example.test", wild); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.records) != 0 || f.rejected != 0 {
		t.Errorf("after both CleanUps the API holds %d records and refused %d calls; want 0 and 0", len(f.records), f.rejected)
	}
}

// A wrong token: the API refuses it, the error says so without the token.
func TestCloudflareWrongToken(t *testing.T) {
	z := newTestZone(t, "example.test", 0)
	f := newFakeCloudflare(t, z)
	wrong := "cf-wrong-token-5e5e5e5e"
	p, err := Load(writeConfig(t, f.config(z, wrong)))
	if err != nil {
		t.Fatal(err)
	}
	err = p.Present(testCtx(t), "www.example.test", "token.thumbprint")
	if err == nil || !strings.Contains(err.Error(), "Authentication error") {
		t.Fatalf("Present = %v, want the API's authentication error", err)
	}
	t.Logf("error: %v", err)
	noSecret(t, err, wrong, f.token)
}
