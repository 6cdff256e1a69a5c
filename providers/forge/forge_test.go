package forge_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/keel-dev/keel/providers/forge"
	"github.com/keel-dev/keel/providers/forge/forgetest"
)

const (
	token  = "s3cr3t-T0KEN-value"
	commit = "0123456789abcdef0123456789abcdef01234567"
)

// fast keeps the retries of a test short.
func fast(cfg forge.Config) forge.Config {
	cfg.RetryMin, cfg.RetryFor, cfg.Timeout = 10*time.Millisecond, 5*time.Second, 5*time.Second
	return cfg
}

func client(t *testing.T, cfg forge.Config) *forge.Client {
	t.Helper()
	c, err := forge.New(fast(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Each forge's stand-in takes the statuses the client posts, in the
// forge's own words and fields, and shows the newest per context.
func TestPostEachForge(t *testing.T) {
	cases := []struct {
		name   string
		kind   forge.Kind
		server forgetest.Kind
		repo   string // as configured; the server's is serverRepo
		// the forge's words for Pending, Success, Failure, Error
		words [4]string
	}{
		{"github", forge.GitHub, forgetest.GitHub, "acme/cluster", [4]string{"pending", "success", "failure", "error"}},
		{"gitea", forge.Gitea, forgetest.Gitea, "acme/cluster", [4]string{"pending", "success", "failure", "error"}},
		{"forgejo", forge.Forgejo, forgetest.Gitea, "acme/cluster", [4]string{"pending", "success", "failure", "error"}},
		{"gitlab by path", forge.GitLab, forgetest.GitLab, "acme/infra/cluster", [4]string{"running", "success", "failed", "canceled"}},
		{"gitlab by ID", forge.GitLab, forgetest.GitLab, "42", [4]string{"running", "success", "failed", "canceled"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			serverRepo := tc.repo
			if tc.repo == "42" {
				serverRepo = "acme/infra/cluster"
			}
			srv := forgetest.New(t, tc.server, token, serverRepo)
			c := client(t, forge.Config{Kind: tc.kind, URL: srv.URL, Repo: tc.repo, Token: token})
			ctx := context.Background()
			for i, st := range []forge.State{forge.Pending, forge.Success} {
				err := c.Post(ctx, forge.Status{Commit: commit, State: st, Context: "keel/n1", Description: "step " + string(st), TargetURL: "https://dash.example.com/"})
				if err != nil {
					t.Fatalf("post %s: %v (refused: %v)", st, err, srv.Refused())
				}
				got, ok := srv.Latest(commit, "keel/n1")
				if !ok || got.State != tc.words[i] || got.Description != "step "+string(st) || got.TargetURL != "https://dash.example.com/" {
					t.Fatalf("after %s the forge shows %+v", st, got)
				}
			}
			// Another node's context is a status of its own.
			if err := c.Post(ctx, forge.Status{Commit: commit, State: forge.Failure, Context: "keel/n2", Description: "refused"}); err != nil {
				t.Fatal(err)
			}
			if err := c.Post(ctx, forge.Status{Commit: commit, State: forge.Error, Context: "keel/n3"}); err != nil {
				t.Fatal(err)
			}
			n1, _ := srv.Latest(commit, "keel/n1")
			n2, _ := srv.Latest(commit, "keel/n2")
			n3, _ := srv.Latest(commit, "keel/n3")
			if n1.State != tc.words[1] || n2.State != tc.words[2] || n3.State != tc.words[3] {
				t.Errorf("states: n1 %q n2 %q n3 %q", n1.State, n2.State, n3.State)
			}
			if r := srv.Refused(); len(r) > 0 {
				t.Errorf("refused: %v", r)
			}
		})
	}
}

// GitLab refuses running → running (a new description while a node
// converges): the state asked for holds, so the Post succeeds.
func TestGitLabRunningTwice(t *testing.T) {
	srv := forgetest.New(t, forgetest.GitLab, token, "acme/cluster")
	c := client(t, forge.Config{Kind: forge.GitLab, URL: srv.URL, Repo: "acme/cluster", Token: token})
	for _, d := range []string{"1 of 2 running", "2 of 3 running"} {
		if err := c.Post(context.Background(), forge.Status{Commit: commit, State: forge.Pending, Context: "keel/n1", Description: d}); err != nil {
			t.Fatal(err)
		}
	}
	if r := srv.Refused(); len(r) != 1 || !strings.Contains(r[0], "Cannot transition status via :run from :running") {
		t.Errorf("the stand-in should have refused the second running: %v", r)
	}
	if err := c.Post(context.Background(), forge.Status{Commit: commit, State: forge.Success, Context: "keel/n1"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := srv.Latest(commit, "keel/n1"); got.State != "success" || len(srv.Statuses(commit)) != 1 {
		t.Errorf("statuses: %+v", srv.Statuses(commit))
	}
}

// A 5xx and a rate limit are retried (the Retry-After waited out); a 4xx
// is not; nothing the forge or the client says quotes the token.
func TestRetries(t *testing.T) {
	st := forge.Status{Commit: commit, State: forge.Success, Context: "keel/n1"}
	t.Run("5xx then success", func(t *testing.T) {
		srv := forgetest.New(t, forgetest.GitHub, token, "acme/cluster")
		srv.FailNext(forgetest.Failure{Code: 502}, forgetest.Failure{Code: 503})
		c := client(t, forge.Config{Kind: forge.GitHub, URL: srv.URL, Repo: "acme/cluster", Token: token})
		if err := c.Post(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		if n := srv.Requests(); n != 3 {
			t.Errorf("%d requests, want 3", n)
		}
	})
	t.Run("429 with Retry-After", func(t *testing.T) {
		srv := forgetest.New(t, forgetest.Gitea, token, "acme/cluster")
		srv.FailNext(forgetest.Failure{Code: 429, RetryAfter: "1"})
		c := client(t, forge.Config{Kind: forge.Gitea, URL: srv.URL, Repo: "acme/cluster", Token: token})
		start := time.Now()
		if err := c.Post(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		// The client waited as asked (a lower bound: no flake when slow).
		if d := time.Since(start); d < time.Second {
			t.Errorf("retried after %v, before the Retry-After of 1 s", d)
		}
		if n := srv.Requests(); n != 2 {
			t.Errorf("%d requests, want 2", n)
		}
	})
	t.Run("Retry-After beyond the cap", func(t *testing.T) {
		srv := forgetest.New(t, forgetest.GitHub, token, "acme/cluster")
		srv.FailNext(forgetest.Failure{Code: 403, RetryAfter: "3600"})
		cfg := fast(forge.Config{Kind: forge.GitHub, URL: srv.URL, Repo: "acme/cluster", Token: token})
		cfg.MaxRetryAfter = time.Second
		c, err := forge.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = c.Post(context.Background(), st)
		var he *forge.HTTPError
		if !errors.As(err, &he) || !he.RateLimited || he.RetryAfter != time.Hour || !forge.Temporary(err) {
			t.Fatalf("err = %v", err)
		}
		if n := srv.Requests(); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
	})
	for _, code := range []int{400, 401, 403, 404, 422} {
		t.Run("no retry on "+http.StatusText(code), func(t *testing.T) {
			srv := forgetest.New(t, forgetest.GitHub, token, "acme/cluster")
			// A forge (or a proxy) that echoes the request back.
			srv.FailNext(forgetest.Failure{Code: code, Body: `{"message":"denied for Bearer ` + token + `"}`})
			c := client(t, forge.Config{Kind: forge.GitHub, URL: srv.URL, Repo: "acme/cluster", Token: token})
			err := c.Post(context.Background(), st)
			if err == nil || forge.Temporary(err) {
				t.Fatalf("err = %v", err)
			}
			if strings.Contains(err.Error(), token) {
				t.Errorf("the error quotes the token: %v", err)
			}
			if n := srv.Requests(); n != 1 {
				t.Errorf("%d requests, want 1", n)
			}
		})
	}
	t.Run("wrong token", func(t *testing.T) {
		for _, k := range []struct {
			c forge.Kind
			s forgetest.Kind
		}{{forge.GitHub, forgetest.GitHub}, {forge.Gitea, forgetest.Gitea}, {forge.GitLab, forgetest.GitLab}} {
			srv := forgetest.New(t, k.s, token, "acme/cluster")
			wrong := "wrong-" + token
			c := client(t, forge.Config{Kind: k.c, URL: srv.URL, Repo: "acme/cluster", Token: wrong})
			err := c.Post(context.Background(), st)
			var he *forge.HTTPError
			if !errors.As(err, &he) || he.Code != 401 || forge.Temporary(err) {
				t.Errorf("%s: err = %v", k.c, err)
			}
			if err != nil && strings.Contains(err.Error(), wrong) {
				t.Errorf("%s: the error quotes the token: %v", k.c, err)
			}
			if len(srv.Statuses(commit)) != 0 {
				t.Errorf("%s: a status was kept with a wrong token", k.c)
			}
		}
	})
	t.Run("network error is retried, then temporary", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // nothing listens there now
		cfg := fast(forge.Config{Kind: forge.GitLab, URL: "http://" + addr, Repo: "7", Token: token})
		cfg.RetryFor = 200 * time.Millisecond
		c, err := forge.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = c.Post(context.Background(), st)
		if err == nil || !forge.Temporary(err) || strings.Contains(err.Error(), token) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("redirect is not followed", func(t *testing.T) {
		other := forgetest.New(t, forgetest.GitLab, token, "acme/cluster")
		srv := &http.Server{Handler: http.RedirectHandler(other.URL+"/api/v4/projects/42/statuses/"+commit, http.StatusTemporaryRedirect)}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		c := client(t, forge.Config{Kind: forge.GitLab, URL: "http://" + l.Addr().String(), Repo: "42", Token: token})
		err = c.Post(context.Background(), st)
		if err == nil || forge.Temporary(err) || !strings.Contains(err.Error(), "redirected") {
			t.Fatalf("err = %v", err)
		}
		if other.Requests() != 0 {
			t.Error("the redirect was followed, with the token")
		}
	})
}

func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  forge.Config
		want string
	}{
		{"no token", forge.Config{Kind: forge.GitHub, Repo: "a/b"}, "no token"},
		{"token with a newline", forge.Config{Kind: forge.GitHub, Repo: "a/b", Token: "abc\n"}, "control"},
		{"plain http to a remote host", forge.Config{Kind: forge.Gitea, URL: "http://git.example.com", Repo: "a/b", Token: "t"}, "clear"},
		{"credentials in the URL", forge.Config{Kind: forge.Gitea, URL: "https://u:p@git.example.com", Repo: "a/b", Token: "t"}, "credentials"},
		{"query", forge.Config{Kind: forge.Gitea, URL: "https://git.example.com/?x=1", Repo: "a/b", Token: "t"}, "query"},
		{"github repo of three parts", forge.Config{Kind: forge.GitHub, Repo: "a/b/c", Token: "t"}, "owner/name"},
		{"dot-dot", forge.Config{Kind: forge.GitLab, URL: "https://gl.example.com", Repo: "a/../b", Token: "t"}, "owner/name"},
		{"gitlab single name", forge.Config{Kind: forge.GitLab, URL: "https://gl.example.com", Repo: "cluster", Token: "t"}, "project ID"},
		{"unknown kind", forge.Config{Kind: "bitbucket", URL: "https://x.example.com", Repo: "a/b", Token: "t"}, "want one of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := forge.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
			if err != nil && tc.cfg.Token != "" && strings.Contains(err.Error(), tc.cfg.Token+"\n") {
				t.Errorf("the error quotes the token: %v", err)
			}
		})
	}
	c, err := forge.New(forge.Config{Kind: forge.GitHub, Repo: "a/b", Token: "t"})
	if err != nil || c == nil {
		t.Fatalf("GitHub's default API URL: %v", err)
	}
	if err := c.Post(context.Background(), forge.Status{Commit: "main", State: forge.Success, Context: "keel/n1"}); err == nil {
		t.Error("a branch name was taken for a commit")
	}
}

func TestDescribe(t *testing.T) {
	long := strings.Repeat("é", 100) // 200 bytes
	for _, tc := range []struct{ in, want string }{
		{"invalid specs:\n  apps/a.yaml:3:7:\tspec.imgae: unknown field", "invalid specs: apps/a.yaml:3:7: spec.imgae: unknown field"},
		{"", ""},
		{strings.Repeat("x", 140), strings.Repeat("x", 140)},
		{strings.Repeat("x", 141), strings.Repeat("x", 137) + "…"},
		{long, strings.Repeat("é", 68) + "…"},
		{"bad \xff byte", "bad byte"},
	} {
		got := forge.Describe(tc.in)
		if got != tc.want {
			t.Errorf("Describe(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if len(got) > forge.MaxDescription || !utf8.ValidString(got) {
			t.Errorf("Describe(%q) = %q: %d bytes, valid %v", tc.in, got, len(got), utf8.ValidString(got))
		}
	}
}

// A description longer than GitHub's 140 characters is cut before it is
// sent: the stand-in refuses a longer one, as GitHub does.
func TestLongDescriptionAccepted(t *testing.T) {
	srv := forgetest.New(t, forgetest.GitHub, token, "acme/cluster")
	c := client(t, forge.Config{Kind: forge.GitHub, URL: srv.URL, Repo: "acme/cluster", Token: token})
	reason := "refused: invalid specs (12 errors), first: " + strings.Repeat("apps/ü.yaml:1:1: spec.image: required; ", 10)
	if err := c.Post(context.Background(), forge.Status{Commit: commit, State: forge.Failure, Context: "keel/n1", Description: reason}); err != nil {
		t.Fatal(err)
	}
	got, _ := srv.Latest(commit, "keel/n1")
	if !strings.HasPrefix(got.Description, "refused: invalid specs") || !strings.HasSuffix(got.Description, "…") {
		t.Errorf("description %q", got.Description)
	}
}

func FuzzDescribe(f *testing.F) {
	f.Add("refused: \x00\n" + strings.Repeat("漢", 60))
	f.Fuzz(func(t *testing.T, s string) {
		d := forge.Describe(s)
		if len(d) > forge.MaxDescription || !utf8.ValidString(d) || strings.ContainsAny(d, "\n\r\t\x00") {
			t.Fatalf("Describe(%q) = %q", s, d)
		}
	})
}

// The stand-ins refuse what their forge refuses, so that the tests above
// prove the client's requests have the documented shape.
func TestStandInsRefuseWrongShapes(t *testing.T) {
	type req struct {
		path, header, value, body string
	}
	body := `{"state":"success","context":"keel/n1"}`
	for _, tc := range []struct {
		name string
		kind forgetest.Kind
		req  req
		want int
	}{
		{"github basic token form", forgetest.GitHub, req{"/repos/a/b/statuses/" + commit, "Authorization", "token " + token, body}, 401},
		{"gitea bearer form", forgetest.Gitea, req{"/api/v1/repos/a/b/statuses/" + commit, "Authorization", "Bearer " + token, body}, 401},
		{"gitlab authorization header", forgetest.GitLab, req{"/api/v4/projects/42/statuses/" + commit, "Authorization", "Bearer " + token, `{"state":"success"}`}, 401},
		{"gitea unknown state", forgetest.Gitea, req{"/api/v1/repos/a/b/statuses/" + commit, "Authorization", "token " + token, `{"state":"running"}`}, 422},
		{"gitea unknown field", forgetest.Gitea, req{"/api/v1/repos/a/b/statuses/" + commit, "Authorization", "token " + token, `{"state":"success","name":"x"}`}, 400},
		{"gitlab github's state word", forgetest.GitLab, req{"/api/v4/projects/42/statuses/" + commit, "PRIVATE-TOKEN", token, `{"state":"failure"}`}, 400},
		{"gitlab unescaped path", forgetest.GitLab, req{"/api/v4/projects/a/b/statuses/" + commit, "PRIVATE-TOKEN", token, `{"state":"success"}`}, 404},
		{"gitea other repository", forgetest.Gitea, req{"/api/v1/repos/a/c/statuses/" + commit, "Authorization", "token " + token, body}, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := forgetest.New(t, tc.kind, token, "a/b")
			r, err := http.NewRequest(http.MethodPost, srv.URL+tc.req.path, strings.NewReader(tc.req.body))
			if err != nil {
				t.Fatal(err)
			}
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Accept", "application/vnd.github+json")
			r.Header.Set("X-GitHub-Api-Version", "2022-11-28")
			r.Header.Set(tc.req.header, tc.req.value)
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want || len(srv.Statuses(commit)) != 0 {
				t.Errorf("answered %d (want %d), statuses %v", resp.StatusCode, tc.want, srv.Statuses(commit))
			}
		})
	}
}
