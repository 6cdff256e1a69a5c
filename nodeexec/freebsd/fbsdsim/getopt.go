package fbsdsim

import "fmt"

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
		for j := 1; j < len(a); j++ {
			c := a[j]
			k := indexByte(optstring, c)
			if c == ':' || k < 0 {
				r.bad = c
				if !quiet {
					r.msg = fmt.Sprintf("%s: illegal option -- %c\n", prog, c)
				}
				r.rest = args[i+1:]
				return r
			}
			if k+1 < len(optstring) && optstring[k+1] == ':' {
				if j+1 < len(a) {
					r.opts = append(r.opts, opt{c, a[j+1:]})
				} else if i+1 < len(args) {
					i++
					r.opts = append(r.opts, opt{c, args[i]})
				} else {
					r.bad, r.missing = c, true
					if !quiet {
						r.msg = fmt.Sprintf("%s: option requires an argument -- %c\n", prog, c)
					}
					r.rest = nil
					return r
				}
				break
			}
			r.opts = append(r.opts, opt{c, ""})
		}
		i++
	}
	r.rest = args[i:]
	return r
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
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
		for j := 1; j < len(a); j++ {
			c := a[j]
			k := indexByte(optstring, c)
			if c == ':' || k < 0 {
				r.bad = c
				if !quiet {
					r.msg = fmt.Sprintf("%s: invalid option -- %c\n", prog, c)
				}
				return r, ""
			}
			if k+1 < len(optstring) && optstring[k+1] == ':' {
				if j+1 < len(a) {
					r.opts = append(r.opts, opt{c, a[j+1:]})
				} else if i+1 < len(args) {
					i++
					r.opts = append(r.opts, opt{c, args[i]})
				} else {
					r.bad, r.missing = c, true
					if !quiet {
						r.msg = fmt.Sprintf("%s: option requires an argument -- %c\n", prog, c)
					}
					return r, ""
				}
				break
			}
			r.opts = append(r.opts, opt{c, ""})
		}
	}
	r.rest = append(operands, args[i:]...)
	return r, ""
}
