package fbsdsim

import (
	"fmt"
	"strings"
)

// getopt parses argv[1:] the way FreeBSD's libc getopt(3) does
// (lib/libc/stdlib/getopt.c): options end at the first non-option
// argument or at "--" (no GNU permutation); an optstring that begins
// with ':' silences getopt's own messages; otherwise an unknown option
// prints "<prog>: illegal option -- c" and a missing argument
// "<prog>: option requires an argument -- c" on stderr.
type opt struct {
	c   byte
	arg string
}

type getoptResult struct {
	opts []opt
	rest []string
	// bad is the option character that failed ('?' semantics), 0 when
	// parsing succeeded; missing is set when it failed for a missing
	// argument.
	bad     byte
	missing bool
	msg     string
}

func getopt(prog string, args []string, optstring string) getoptResult {
	var r getoptResult
	quiet := len(optstring) > 0 && optstring[0] == ':'
	i := 0
	for i < len(args) {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if len(a) < 2 || a[0] != '-' {
			break
		}
		var ok bool
		if i, ok = cluster(&r, prog, args, i, optstring, quiet, "illegal"); !ok {
			if r.missing {
				r.rest = nil
			} else {
				r.rest = args[i+1:]
			}
			return r
		}
		i++
	}
	r.rest = args[i:]
	return r
}

// cluster parses the option cluster args[i] ("-ab", "-ofile"), an
// option's argument being the rest of the word or, at its end, the next
// word. It returns the index of the last word it used, or false with r.bad
// (and r.msg unless quiet) set for an unknown option (unknown is the word
// the message uses for it) or a missing argument.
func cluster(r *getoptResult, prog string, args []string, i int, optstring string, quiet bool, unknown string) (int, bool) {
	a := args[i]
	for j := 1; j < len(a); j++ {
		c := a[j]
		k := strings.IndexByte(optstring, c)
		if c == ':' || k < 0 {
			r.bad = c
			if !quiet {
				r.msg = fmt.Sprintf("%s: %s option -- %c\n", prog, unknown, c)
			}
			return i, false
		}
		if k+1 < len(optstring) && optstring[k+1] == ':' {
			switch {
			case j+1 < len(a):
				r.opts = append(r.opts, opt{c, a[j+1:]})
			case i+1 < len(args):
				i++
				r.opts = append(r.opts, opt{c, args[i]})
			default:
				r.bad, r.missing = c, true
				if !quiet {
					r.msg = fmt.Sprintf("%s: option requires an argument -- %c\n", prog, c)
				}
				return i, false
			}
			return i, true
		}
		r.opts = append(r.opts, opt{c, ""})
	}
	return i, true
}

// getoptLong parses argv[1:] the way FreeBSD's getopt_long(3) does
// (lib/libc/stdlib/getopt_long.c, built GNU_COMPATIBLE): non-options
// are permuted to the end, so options may follow operands, until "--";
// a lone "-" is an operand. Unless optstring begins with ':', an unknown
// option prints "<prog>: invalid option -- c" (the POSIXLY_CORRECT
// "illegal option" text is not modelled) and a missing argument
// "<prog>: option requires an argument -- c". Long options (--json)
// are not modelled: long is set to the first one.
func getoptLong(prog string, args []string, optstring string) (r getoptResult, long string) {
	quiet := len(optstring) > 0 && optstring[0] == ':'
	var operands []string
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		if len(a) < 2 || a[0] != '-' {
			operands = append(operands, a)
			continue
		}
		if a[1] == '-' {
			return r, a
		}
		var ok bool
		if i, ok = cluster(&r, prog, args, i, optstring, quiet, "invalid"); !ok {
			return r, ""
		}
	}
	r.rest = append(operands, args[i:]...)
	return r, ""
}
