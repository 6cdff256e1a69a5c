package dns01

import (
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	stdsync "sync"
	"testing"
	"time"
)

// fakeOVH is OVH's API (eu.api.ovh.com/1.0) as far as DNS records go,
// stateful, and strict about the documented request signing: every
// authenticated call carries X-Ovh-Application, X-Ovh-Consumer,
// X-Ovh-Timestamp (the API's clock, as GET /auth/time gives it) and
// X-Ovh-Signature = "$1$" + sha1hex(appSecret+"+"+consumerKey+"+"+METHOD+
// "+"+fullURL+"+"+body+"+"+timestamp). Records created are published to
// the zone's name servers only by POST .../refresh, as OVH does.
type fakeOVH struct {
	appKey, appSecret, consumerKey string
	zoneName                       string
	zone                           *testZone
	// clockOffset puts the API's clock an hour off the machine's, so a
	// client that signs with its own clock instead of /auth/time fails.
	clockOffset time.Duration
	srv         *httptest.Server

	mu        stdsync.Mutex
	nextID    int64
	records   map[int64]ovhRecord
	published map[string]bool // names whose TXT records the zone serves
	timeAsked int
	refreshes int
	rejected  []string // why each refused call was refused
}

type ovhRecord struct {
	ID        int64  `json:"id"`
	FieldType string `json:"fieldType"`
	SubDomain string `json:"subDomain"`
	Target    string `json:"target"`
	TTL       int    `json:"ttl"`
	Zone      string `json:"zone"`
}

func newFakeOVH(t *testing.T, z *testZone) *fakeOVH {
	f := &fakeOVH{
		appKey: "ovh-app-key-7f3a", appSecret: "ovh-app-secret-c0ffee", consumerKey: "ovh-consumer-key-d00d",
		zoneName: strings.TrimSuffix(z.origin, "."), zone: z, clockOffset: time.Hour,
		nextID: 1000, records: map[int64]ovhRecord{}, published: map[string]bool{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /1.0/auth/time", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.timeAsked++
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, f.now().Unix())
	})
	mux.HandleFunc("POST /1.0/domain/zone/{zone}/record", f.auth(f.create))
	mux.HandleFunc("DELETE /1.0/domain/zone/{zone}/record/{id}", f.auth(f.delete))
	mux.HandleFunc("POST /1.0/domain/zone/{zone}/refresh", f.auth(f.refresh))
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeOVH) now() time.Time { return time.Now().Add(f.clockOffset) }

func ovhError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"errorCode": code, "httpCode": fmt.Sprintf("%d %s", status, http.StatusText(status)), "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// auth checks the signature before handing the call (and its body) on.
func (f *fakeOVH) auth(next func(http.ResponseWriter, *http.Request, []byte)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			ovhError(w, http.StatusBadRequest, "BAD_REQUEST", "unreadable body")
			return
		}
		reject := func(code, msg string) {
			f.mu.Lock()
			f.rejected = append(f.rejected, msg)
			f.mu.Unlock()
			ovhError(w, http.StatusForbidden, code, msg)
		}
		if r.Header.Get("X-Ovh-Application") != f.appKey {
			reject("INVALID_KEY", "This application key is invalid")
			return
		}
		if r.Header.Get("X-Ovh-Consumer") != f.consumerKey {
			reject("NOT_CREDENTIAL", "This credential does not exist")
			return
		}
		ts := r.Header.Get("X-Ovh-Timestamp")
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || f.now().Sub(time.Unix(sec, 0)).Abs() > time.Minute {
			reject("QUERY_TIME_OUT", "Query out of time")
			return
		}
		fullURL := "http://" + r.Host + r.URL.RequestURI()
		sum := sha1.Sum([]byte(strings.Join([]string{f.appSecret, f.consumerKey, r.Method, fullURL, string(body), ts}, "+")))
		if r.Header.Get("X-Ovh-Signature") != "$1$"+hex.EncodeToString(sum[:]) {
			reject("INVALID_SIGNATURE", "Invalid signature")
			return
		}
		if r.PathValue("zone") != f.zoneName {
			ovhError(w, http.StatusNotFound, "NOT_FOUND", "This service does not exist")
			return
		}
		next(w, r, body)
	}
}

func (f *fakeOVH) create(w http.ResponseWriter, r *http.Request, body []byte) {
	var rec ovhRecord
	if err := json.Unmarshal(body, &rec); err != nil || rec.FieldType == "" || rec.Target == "" {
		ovhError(w, http.StatusBadRequest, "BAD_REQUEST", "Invalid record")
		return
	}
	f.mu.Lock()
	f.nextID++
	rec.ID, rec.Zone = f.nextID, f.zoneName
	f.records[rec.ID] = rec
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, rec)
}

func (f *fakeOVH) delete(w http.ResponseWriter, r *http.Request, _ []byte) {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	f.mu.Lock()
	_, ok := f.records[id]
	delete(f.records, id)
	f.mu.Unlock()
	if !ok {
		ovhError(w, http.StatusNotFound, "NOT_FOUND", "The requested object does not exist")
		return
	}
	writeJSON(w, http.StatusOK, nil)
}

// refresh publishes the records to the name servers.
func (f *fakeOVH) refresh(w http.ResponseWriter, r *http.Request, _ []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refreshes++
	byName := map[string][]string{}
	for name := range f.published {
		byName[name] = nil
	}
	for _, rec := range f.records {
		if rec.FieldType != "TXT" {
			continue
		}
		name := rec.SubDomain + "." + f.zone.origin
		byName[name] = append(byName[name], rec.Target)
		f.published[name] = true
	}
	for name, values := range byName {
		f.zone.setTXT(name, values)
	}
	writeJSON(w, http.StatusOK, nil)
}

func (f *fakeOVH) config(z *testZone, secret string) string {
	return fmt.Sprintf("provider: ovh\nendpoint: %s/1.0\napplicationKey: %s\napplicationSecret: %s\nconsumerKey: %s\n",
		f.srv.URL, f.appKey, secret, f.consumerKey) + z.propagationSettings(30*time.Second)
}

// OVH through lego's provider, against the fake API, with lego's request
// dumper asked for in the environment (an operator's debugging switch):
// it stays off, since it would print the consumer key on stdout.
func TestOVH(t *testing.T) {
	t.Setenv("LEGO_DEBUG_DNS_API_HTTP_CLIENT", "true")
	z := newTestZone(t, "example.test", 2)
	f := newFakeOVH(t, z)
	ctx := testCtx(t)
	stdout := captureStdout(t, func() {
		p, err := Load(writeConfig(t, f.config(z, f.appSecret)))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Present(ctx, "www.example.test", "token.thumbprint"); err != nil {
			t.Fatal(err)
		}
		if err := p.CleanUp(ctx, "www.example.test", "token.thumbprint"); err != nil {
			t.Fatal(err)
		}
	})
	if strings.Contains(stdout, f.consumerKey) || strings.Contains(stdout, "X-Ovh") {
		t.Errorf("requests were dumped on stdout:\n%.500s", stdout)
	}
	f.mu.Lock()
	if f.refreshes != 2 || len(f.records) != 0 {
		t.Errorf("the API saw %d refreshes and holds %d records after Present and CleanUp; want 2 and 0", f.refreshes, len(f.records))
	}
	f.mu.Unlock()
}

// captureStdout runs fn with os.Stdout going to a file, and returns what
// was written.
func captureStdout(t *testing.T, fn func()) string {
	t.Helper()
	tmp, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer tmp.Close()
	saved := os.Stdout
	os.Stdout = tmp
	defer func() { os.Stdout = saved }()
	fn()
	b, err := os.ReadFile(tmp.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// OVH step by step: the record is created, published by a refresh and
// served by both name servers when Present returns; CleanUp deletes it.
func TestOVHRecord(t *testing.T) {
	z := newTestZone(t, "example.test", 2)
	f := newFakeOVH(t, z)
	p, err := Load(writeConfig(t, f.config(z, f.appSecret)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	const name = "_acme-challenge.www.example.test."
	if err := p.Present(ctx, "www.example.test", "token.thumbprint"); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	if f.timeAsked == 0 || f.refreshes != 1 || len(f.records) != 1 || len(f.rejected) != 0 {
		t.Errorf("after Present the API saw %d /auth/time, %d refreshes, holds %d records, refused %q; want >0, 1, 1, none",
			f.timeAsked, f.refreshes, len(f.records), f.rejected)
	}
	for _, rec := range f.records {
		if rec.SubDomain != "_acme-challenge.www" || rec.FieldType != "TXT" || rec.Target != RecordValue("token.thumbprint") {
			t.Errorf("record created: %+v", rec)
		}
	}
	f.mu.Unlock()
	for i := range z.ns {
		if got := z.served(i, name); !slices.Equal(got, []string{RecordValue("token.thumbprint")}) {
			t.Errorf("%s serves %q after Present", z.ns[i].name, got)
		}
	}

	if err := p.CleanUp(ctx, "www.example.test", "token.thumbprint"); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	if len(f.records) != 0 || f.refreshes != 2 {
		t.Errorf("after CleanUp the API holds %d records after %d refreshes; want 0 after 2", len(f.records), f.refreshes)
	}
	f.mu.Unlock()
	if got, _ := z.txt(t, 0, name); len(got) != 0 {
		t.Errorf("ns1 still serves %q after CleanUp", got)
	}
}

// A wrong application secret: the API refuses the signature, the error
// says so and holds no credential.
func TestOVHWrongSecret(t *testing.T) {
	z := newTestZone(t, "example.test", 0)
	f := newFakeOVH(t, z)
	wrong := "not-the-ovh-app-secret-4242"
	p, err := Load(writeConfig(t, f.config(z, wrong)))
	if err != nil {
		t.Fatal(err)
	}
	err = p.Present(testCtx(t), "www.example.test", "token.thumbprint")
	if err == nil || !strings.Contains(err.Error(), "Invalid signature") {
		t.Fatalf("Present = %v, want the API's refusal of the signature", err)
	}
	t.Logf("error: %v", err)
	noSecret(t, err, wrong, f.appSecret, f.consumerKey, f.appKey)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.records) != 0 {
		t.Errorf("a refused call created a record")
	}
}
