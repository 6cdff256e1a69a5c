// Package forgetest runs stand-ins for the commit status APIs of GitHub,
// Gitea/Forgejo and GitLab on a loopback listener, for the tests of the
// forge client and of the agent. Each checks a request the way its forge
// documents it (method, path, the form of the token's header, the JSON
// fields and the states allowed) and keeps the statuses per commit and
// context as the forge does, GitLab's state machine included.
package forgetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"
	"unicode/utf8"
)

// Kind is the forge a Server stands in for: "github", "gitea" (also
// Forgejo's API) or "gitlab".
type Kind string

// The forges a Server stands in for.
const (
	GitHub Kind = "github"
	Gitea  Kind = "gitea"
	GitLab Kind = "gitlab"
)

// Status is a status as the forge keeps it, in the forge's own words.
type Status struct {
	ID          int
	State       string
	Context     string // GitLab's name
	Description string
	TargetURL   string
	Created     time.Time
}

// Failure is an answer the server gives instead of handling a request.
type Failure struct {
	Code       int
	RetryAfter string // the Retry-After header, "" for none
	Body       string
}

// Server is a stand-in forge. Its methods are safe for concurrent use.
type Server struct {
	*httptest.Server
	kind  Kind
	token string
	// repo is the repository statuses may be posted to: owner/name, or
	// for GitLab the project's path (its ID is projectID).
	repo string

	mu       gosync.Mutex
	statuses map[string][]Status // by commit, oldest first
	requests int
	refused  []string // why requests were refused, in order
	fail     []Failure
	nextID   int
	block    chan struct{} // while non-nil, requests wait for it to close
}

// projectID is the numeric ID a GitLab Server gives its project.
const projectID = "42"

// New starts a Server for kind that accepts token for repo (owner/name;
// for GitLab the project's path, also reachable by its ID 42). It is
// closed when the test ends.
func New(t testing.TB, kind Kind, token, repo string) *Server {
	s := &Server{kind: kind, token: token, repo: repo, statuses: map[string][]Status{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// ProjectID is a GitLab Server's project ID.
func (s *Server) ProjectID() string { return projectID }

// FailNext makes the next len(f) requests answer f, in order.
func (s *Server) FailNext(f ...Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = append(s.fail, f...)
}

// Block makes requests wait until the function it returns is called.
func (s *Server) Block() (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	s.block = ch
	return gosync.OnceFunc(func() {
		s.mu.Lock()
		s.block = nil
		s.mu.Unlock()
		close(ch)
	})
}

// Requests counts the requests received, refused or not.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Refused lists why requests were refused (the server's answers), in order.
func (s *Server) Refused() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.refused)
}

// Statuses returns every status of commit, oldest first (GitHub and Gitea
// keep each one posted; GitLab updates a status in place while it runs).
func (s *Server) Statuses(commit string) []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.statuses[commit])
}

// Latest returns the newest status of commit in context, as the forge's
// commit page shows it.
func (s *Server) Latest(commit, context string) (Status, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latestLocked(commit, context)
}

func (s *Server) latestLocked(commit, context string) (Status, bool) {
	list := s.statuses[commit]
	for i := len(list) - 1; i >= 0; i-- {
		// GitHub's contexts are case-insensitive.
		if strings.EqualFold(list[i].Context, context) {
			return list[i], true
		}
	}
	return Status{}, false
}

var hexHash = regexp.MustCompile(`^[0-9a-f]{40}$`)

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests++
	block := s.block
	var fail *Failure
	if len(s.fail) > 0 {
		fail = &s.fail[0]
		s.fail = s.fail[1:]
	}
	s.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-r.Context().Done():
			return
		}
	}
	if fail != nil {
		if fail.RetryAfter != "" {
			w.Header().Set("Retry-After", fail.RetryAfter)
		}
		s.refuse(w, fail.Code, fmt.Sprintf("injected %d", fail.Code), fail.Body)
		return
	}
	switch s.kind {
	case GitHub:
		s.github(w, r)
	case Gitea:
		s.gitea(w, r)
	case GitLab:
		s.gitlab(w, r)
	}
}

// refuse answers code with the forge's JSON error {"message": msg}, or
// body when set, and records why.
func (s *Server) refuse(w http.ResponseWriter, code int, why, body string) {
	s.mu.Lock()
	s.refused = append(s.refused, fmt.Sprintf("%d %s", code, why))
	s.mu.Unlock()
	if body == "" {
		b, _ := json.Marshal(map[string]string{"message": why})
		body = string(b)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprint(w, body)
}

// decode reads the request's JSON body strictly into v.
func decode(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return fmt.Errorf("content type %q, not JSON", ct)
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	return nil
}

// statusBody is the JSON body of GitHub's and Gitea's create-a-status.
type statusBody struct {
	State       *string `json:"state"`
	TargetURL   string  `json:"target_url"`
	Description string  `json:"description"`
	Context     string  `json:"context"`
}

// github: POST /repos/{owner}/{repo}/statuses/{sha}, with a bearer token,
// GitHub's media type and API version; states error, failure, pending,
// success; a description of at most 140 characters; 201 with the status.
func (s *Server) github(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+s.token {
		s.refuse(w, http.StatusUnauthorized, "Bad credentials", "")
		return
	}
	if r.Header.Get("Accept") != "application/vnd.github+json" || r.Header.Get("X-GitHub-Api-Version") != "2022-11-28" {
		s.refuse(w, http.StatusBadRequest, "want Accept: application/vnd.github+json and X-GitHub-Api-Version: 2022-11-28", "")
		return
	}
	sha, ok := strings.CutPrefix(r.URL.EscapedPath(), "/repos/"+s.repo+"/statuses/")
	if r.Method != http.MethodPost || !ok {
		s.refuse(w, http.StatusNotFound, "Not Found", "")
		return
	}
	s.create(w, r, sha, []string{"error", "failure", "pending", "success"}, 140)
}

// gitea: POST /api/v1/repos/{owner}/{repo}/statuses/{sha}, with
// "Authorization: token"; states pending, success, error, failure, warning.
func (s *Server) gitea(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "token "+s.token {
		s.refuse(w, http.StatusUnauthorized, "token is required", "")
		return
	}
	sha, ok := strings.CutPrefix(r.URL.EscapedPath(), "/api/v1/repos/"+s.repo+"/statuses/")
	if r.Method != http.MethodPost || !ok {
		s.refuse(w, http.StatusNotFound, "Not Found", "")
		return
	}
	s.create(w, r, sha, []string{"pending", "success", "error", "failure", "warning"}, 0)
}

// create keeps a status of GitHub's or Gitea's, each posted one a new
// entry (the newest per context is the one shown).
func (s *Server) create(w http.ResponseWriter, r *http.Request, sha string, states []string, maxDesc int) {
	if !hexHash.MatchString(sha) {
		s.refuse(w, http.StatusUnprocessableEntity, "No commit found for SHA: "+sha, "")
		return
	}
	var b statusBody
	if err := decode(r, &b); err != nil {
		s.refuse(w, http.StatusBadRequest, "Problems parsing JSON: "+err.Error(), "")
		return
	}
	switch {
	case b.State == nil || !slices.Contains(states, *b.State):
		s.refuse(w, http.StatusUnprocessableEntity, fmt.Sprintf("Validation Failed: state %v", b.State), "")
		return
	case maxDesc > 0 && utf8.RuneCountInString(b.Description) > maxDesc:
		s.refuse(w, http.StatusUnprocessableEntity, "Validation Failed: description is too long (maximum is 140 characters)", "")
		return
	case b.TargetURL != "" && !strings.HasPrefix(b.TargetURL, "http://") && !strings.HasPrefix(b.TargetURL, "https://"):
		s.refuse(w, http.StatusUnprocessableEntity, "Validation Failed: target_url", "")
		return
	}
	if b.Context == "" {
		b.Context = "default"
	}
	s.mu.Lock()
	s.nextID++
	st := Status{ID: s.nextID, State: *b.State, Context: b.Context, Description: b.Description, TargetURL: b.TargetURL, Created: time.Now()}
	s.statuses[sha] = append(s.statuses[sha], st)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{
		"id": st.ID, "state": st.State, "context": st.Context, "description": st.Description, "target_url": st.TargetURL,
		"created_at": st.Created.UTC().Format(time.RFC3339),
	})
}

// gitlabBody is the JSON body of GitLab's post-a-status.
type gitlabBody struct {
	State       *string `json:"state"`
	Ref         string  `json:"ref"`
	Name        string  `json:"name"`
	Context     string  `json:"context"`
	TargetURL   string  `json:"target_url"`
	Description string  `json:"description"`
	Coverage    float64 `json:"coverage"`
	PipelineID  int     `json:"pipeline_id"`
}

// gitlab: POST /api/v4/projects/{id or URL-encoded path}/statuses/{sha},
// with a PRIVATE-TOKEN header; states pending, running, success, failed,
// canceled; the label is name (context its older alias). A status of a
// name that is not finished moves through GitLab's state machine (pending
// to pending, or running to running, is refused with 400); a finished
// one is followed by a new status.
func (s *Server) gitlab(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("PRIVATE-TOKEN") != s.token {
		s.refuse(w, http.StatusUnauthorized, "401 Unauthorized", "")
		return
	}
	path := r.URL.EscapedPath()
	var sha string
	ok := false
	for _, id := range []string{projectID, strings.ReplaceAll(s.repo, "/", "%2F")} {
		if rest, found := strings.CutPrefix(path, "/api/v4/projects/"+id+"/statuses/"); found {
			sha, ok = rest, true
		}
	}
	if r.Method != http.MethodPost || !ok {
		s.refuse(w, http.StatusNotFound, "404 Project Not Found", "")
		return
	}
	if !hexHash.MatchString(sha) {
		s.refuse(w, http.StatusNotFound, "404 Commit Not Found", "")
		return
	}
	var b gitlabBody
	if err := decode(r, &b); err != nil {
		s.refuse(w, http.StatusBadRequest, err.Error(), "")
		return
	}
	states := []string{"pending", "running", "success", "failed", "canceled"}
	if b.State == nil || !slices.Contains(states, *b.State) {
		s.refuse(w, http.StatusBadRequest, "state does not have a valid value", `{"error":"state does not have a valid value"}`)
		return
	}
	name := b.Name
	if name == "" {
		name = b.Context
	}
	if name == "" {
		name = "default"
	}
	s.mu.Lock()
	prev, had := s.latestLocked(sha, name)
	s.mu.Unlock()
	finished := func(st string) bool { return st == "success" || st == "failed" || st == "canceled" }
	update := had && !finished(prev.State)
	if update {
		event := map[string]string{"pending": "enqueue", "running": "run", "success": "success", "failed": "drop", "canceled": "cancel"}[*b.State]
		if (*b.State == "pending" && prev.State != "created") || (*b.State == "running" && prev.State == "running") {
			s.refuse(w, http.StatusBadRequest, fmt.Sprintf("Cannot transition status via :%s from :%s (Reason(s): Status cannot transition via \"%s\")", event, prev.State, event), "")
			return
		}
	}
	s.mu.Lock()
	list := s.statuses[sha]
	if update {
		for i := range list {
			if list[i].ID == prev.ID {
				list[i].State, list[i].Description, list[i].TargetURL = *b.State, b.Description, b.TargetURL
			}
		}
	} else {
		s.nextID++
		s.statuses[sha] = append(list, Status{ID: s.nextID, State: *b.State, Context: name, Description: b.Description, TargetURL: b.TargetURL, Created: time.Now()})
	}
	st, _ := s.latestLocked(sha, name)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{
		"id": st.ID, "sha": sha, "status": st.State, "name": st.Context, "description": st.Description, "target_url": st.TargetURL,
	})
}
