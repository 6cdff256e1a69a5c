package dashboard

import "testing"

func TestCommitURL(t *testing.T) {
	h := tipHash
	for _, tc := range []struct {
		repo, want string
	}{
		{"https://github.com/acme/cluster.git", "https://github.com/acme/cluster/commit/" + h},
		{"https://github.com/acme/cluster", "https://github.com/acme/cluster/commit/" + h},
		{"https://gitlab.com/acme/infra/cluster.git", "https://gitlab.com/acme/infra/cluster/-/commit/" + h},
		{"https://codeberg.org/acme/cluster.git/", "https://codeberg.org/acme/cluster/commit/" + h},
		{"https://gitlab.example.com/ops/cluster.git", "https://gitlab.example.com/ops/cluster/-/commit/" + h},
		{"https://git.example.com:3000/ops/cluster.git", "https://git.example.com:3000/ops/cluster/commit/" + h},
		// Credentials, query and fragment never reach the link.
		{"https://x-access-token:s3cret@github.com/acme/cluster.git?ref=1#frag", "https://github.com/acme/cluster/commit/" + h},
		{"git@github.com:acme/cluster.git", "https://github.com/acme/cluster/commit/" + h},
		{"ssh://git@gitlab.com:22/acme/cluster.git", "https://gitlab.com/acme/cluster/-/commit/" + h},
		{"ssh://git@codeberg.org/acme/cluster", "https://codeberg.org/acme/cluster/commit/" + h},
		// No page a browser can open, or none known.
		{"ssh://git@git.example.com/ops/cluster.git", ""},
		{"git@git.example.com:ops/cluster.git", ""},
		{"http://github.com/acme/cluster.git", ""},
		{"file:///srv/git/cluster.git", ""},
		{"/srv/git/cluster.git", ""},
		{"./cluster", ""},
		{"", ""},
		{"https://github.com/", ""},
		{"https://github.com", ""},
		{"javascript:alert(1)", ""},
		{"git://github.com/acme/cluster.git", ""},
	} {
		if got := CommitURL(tc.repo, h); got != tc.want {
			t.Errorf("CommitURL(%q) = %q, want %q", tc.repo, got, tc.want)
		}
	}
	for _, bad := range []string{"", "abc", "0123456789ABCDEF0123456789ABCDEF01234567", h + "0", "../../x"} {
		if got := CommitURL("https://github.com/acme/cluster", bad); got != "" {
			t.Errorf("CommitURL(hash %q) = %q, want no link", bad, got)
		}
	}
}
