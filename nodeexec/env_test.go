package nodeexec

import (
	"slices"
	"testing"
)

func TestExpand(t *testing.T) {
	env := map[string]string{"NAME": "web-0", "A_1": "x", "EMPTY": ""}
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"$NAME", "web-0"},
		{"${NAME}", "web-0"},
		{"pre-${NAME}-post", "pre-web-0-post"},
		{"$NAME.log", "web-0.log"},
		{"$A_1$NAME", "xweb-0"},
		{"${A_1}1", "x1"},
		{"$NOPE", ""},
		{"[${NOPE}]", "[]"},
		{"$EMPTY", ""},
		{"$$NAME", "$NAME"},
		{"$$$NAME", "$web-0"},
		{"cost: 5$", "cost: 5$"},
		{"$1 $? $@ $#", "$1 $? $@ $#"},
		{"${x:-default}", "${x:-default}"},
		{"${unclosed", "${unclosed"},
		{"${}", "${}"},
		{"$ NAME", "$ NAME"},
		{"$((i+1))", "$((i+1))"},
	} {
		if got := expand(tc.in, env); got != tc.want {
			t.Errorf("expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	args := []string{"sh", "-c", "echo $NAME"}
	if got := ExpandArgs(args, env); !slices.Equal(got, []string{"sh", "-c", "echo web-0"}) || args[2] != "echo $NAME" {
		t.Errorf("ExpandArgs = %q (input now %q)", got, args)
	}
}
