package dashboard

import (
	"net/url"
	"regexp"
	"strings"
)

// knownForges are the hosts whose ssh URLs map to a web page at the same
// path over https (any https URL is taken as a forge's page as it is).
var knownForges = map[string]bool{"github.com": true, "gitlab.com": true, "codeberg.org": true}

var commitHash = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)

// scpLike is git's user@host:path form of an ssh URL.
var scpLike = regexp.MustCompile(`^(?:[A-Za-z0-9._-]+@)?([A-Za-z0-9.-]+):([^/].*)$`)

// CommitURL is the web page of commit hash in the repository repoURL
// names, or "" when repoURL names no page a browser can open: a local
// path, a file:// or http:// URL, or an ssh URL of a host not known to be
// a forge. GitLab's page is <base>/-/commit/<hash> (a host named
// gitlab.com or gitlab.*); GitHub's, Gitea's and Forgejo's (any other
// host) <base>/commit/<hash>. Credentials, query and fragment of repoURL
// never reach the link.
func CommitURL(repoURL, hash string) string {
	if !commitHash.MatchString(hash) {
		return ""
	}
	base := forgeBase(repoURL)
	if base == nil {
		return ""
	}
	sep := "/commit/"
	if h := base.Hostname(); h == "gitlab.com" || strings.HasPrefix(h, "gitlab.") {
		sep = "/-/commit/"
	}
	base.Path += sep + hash
	return base.String()
}

// forgeBase is the https address of the repository's web page.
func forgeBase(repoURL string) *url.URL {
	var host, path string
	if m := scpLike.FindStringSubmatch(repoURL); m != nil && !strings.Contains(repoURL, "://") {
		host, path = m[1], "/"+m[2]
		if !knownForges[strings.ToLower(host)] {
			return nil
		}
	} else {
		u, err := url.Parse(repoURL)
		if err != nil || u.Host == "" {
			return nil
		}
		switch u.Scheme {
		case "https":
			host = u.Host
		case "ssh", "git+ssh":
			host = u.Hostname() // the web page is not on the ssh port
			if !knownForges[strings.ToLower(host)] {
				return nil
			}
		default:
			return nil
		}
		path = u.Path
	}
	path = strings.TrimSuffix(strings.TrimRight(path, "/"), ".git")
	if path == "" || path == "/" || strings.Contains(path, "/../") || strings.HasSuffix(path, "/..") {
		return nil
	}
	return &url.URL{Scheme: "https", Host: strings.ToLower(host), Path: path}
}
