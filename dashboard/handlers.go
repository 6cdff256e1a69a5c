package dashboard

import (
	"bytes"
	"embed"
	"encoding/json"
	"html/template"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/keel-dev/keel/render"
	"github.com/keel-dev/keel/status"
)

// ContentSecurityPolicy is sent with every response: nothing but the
// dashboard's own stylesheet and images loads, no script runs, no form
// submits, no other site frames it.
const ContentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// allowedMethods is the Allow header of a 405: the dashboard only reads.
const allowedMethods = "GET, HEAD"

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

var (
	overviewPage = parsePage("overview.html")
	nodePage     = parsePage("node.html")
)

func parsePage(name string) *template.Template {
	return template.Must(template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name))
}

// ServeHTTP serves the dashboard.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.handler.ServeHTTP(w, r)
}

func (d *Dashboard) routes() http.Handler {
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // the embedded directory is there by construction
	}
	files := http.FileServerFS(static)
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", d.overview)
	mux.HandleFunc("/nodes/{name}", d.node)
	mux.HandleFunc("/api/status", d.apiStatus)
	mux.HandleFunc("/healthz", healthz)
	mux.Handle("/static/", http.StripPrefix("/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no directory listings
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=300")
		files.ServeHTTP(w, r)
	})))
	return secure(mux)
}

// secure sets the security headers of every response and refuses every
// method but GET and HEAD, on every path.
func secure(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", allowedMethods)
			http.Error(w, "method not allowed: the dashboard is read-only", http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write([]byte("ok\n"))
}

// apiStatus serves the document keel status -o json prints, for the last
// status read.
func (d *Dashboard) apiStatus(w http.ResponseWriter, _ *http.Request) {
	s := d.state.Load()
	w.Header().Set("Cache-Control", "no-store")
	if s.st == nil {
		msg := "no status read yet"
		if s.err != nil {
			msg += ": " + s.err.Error()
		}
		http.Error(w, msg, http.StatusServiceUnavailable)
		return
	}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, s.st); err != nil {
		http.Error(w, "cannot encode the status", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Last-Modified", s.read.UTC().Format(http.TimeFormat))
	w.Write(buf.Bytes())
}

// WriteJSON writes st as keel status -o json does.
func WriteJSON(w io.Writer, st *status.Status) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(st)
}

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	d.render(w, overviewPage, d.page(), http.StatusOK)
}

// node serves a node's page: the node must be a valid name and in the
// status (in the inventory, or reporting).
func (d *Dashboard) node(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if render.CheckName(name) != nil {
		http.NotFound(w, r)
		return
	}
	p := d.page()
	if p.St != nil {
		for i := range p.St.Nodes {
			if p.St.Nodes[i].Name == name {
				p.Node = &p.St.Nodes[i]
				break
			}
		}
	}
	if p.Node == nil {
		http.NotFound(w, r)
		return
	}
	p.Title = name
	d.render(w, nodePage, p, http.StatusOK)
}

func (d *Dashboard) render(w http.ResponseWriter, t *template.Template, p *page, code int) {
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", p); err != nil {
		d.opts.Logger.Error("dashboard: cannot render a page", "err", err)
		http.Error(w, "cannot render the page", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

// page is what a template sees.
type page struct {
	Title   string
	Refresh int // seconds between the page's reloads
	Version string
	Now     time.Time
	// St is the last status read (nil before the first), Read when it
	// was read; Err is the last read's error, at ErrTime.
	St      *status.Status
	Read    time.Time
	Err     error
	ErrTime time.Time
	// Node is the node of a node's page.
	Node    *status.Node
	repoURL string
}

func (d *Dashboard) page() *page {
	s := d.state.Load()
	return &page{Refresh: max(1, int(d.opts.Refresh/time.Second)), Version: d.opts.Version, Now: d.opts.Now(),
		St: s.st, Read: s.read, Err: s.err, ErrTime: s.errTime, repoURL: d.opts.RepoURL}
}

// Every is the refresh interval, written as a duration.
func (p *page) Every() string { return (time.Duration(p.Refresh) * time.Second).String() }

// Ago says how long before the page t was: "42s".
func (p *page) Ago(t time.Time) string {
	return status.Age(int64(max(0, p.Now.Sub(t)) / time.Second))
}

// Until says how long after the page t is, or "expired".
func (p *page) Until(t time.Time) string {
	if !t.After(p.Now) {
		return "expired"
	}
	return "in " + status.Age(int64(t.Sub(p.Now)/time.Second))
}

// CommitURL is hash's page on the forge, or "" (no link).
func (p *page) CommitURL(hash string) string { return CommitURL(p.repoURL, hash) }

// Class is the headline's class: good (converged), bad (not converged),
// warn (the last status read is old and reading fails: Stale), or unknown
// (nothing read yet).
func (p *page) Class() string {
	switch {
	case p.St == nil:
		return "unknown"
	case p.Stale():
		return "warn"
	case p.St.Converged:
		return "good"
	default:
		return "bad"
	}
}

// Stale is true when reading has failed for longer than three refresh
// intervals (at least a minute): the status shown may no longer hold.
func (p *page) Stale() bool {
	limit := max(time.Minute, 3*time.Duration(p.Refresh)*time.Second)
	return p.Err != nil && p.Now.Sub(p.Read) > limit
}
