package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Flags such as --crc and --markers have a value that may be left out
// (--crc alone is on, --markers alone is on). pflag then takes a value
// only in the --flag=value form: in "--markers prefer" the word would be
// a positional argument ("unknown command"). Such flags use the Values
// below, which name the words they accept, and joinWordValues rewrites
// "--flag word" to "--flag=word" before cobra parses, so both spellings
// work, as the user guide (doc/user-guide.md) writes them.

// wordValue is a flag that accepts one of a fixed set of words; a flag
// with NoOptDefVal set may be given its word after a space.
type wordValue interface {
	pflag.Value
	accepts(word string) bool
}

// switchValue is a boolean flag spelled on/off (also true/false, yes/no,
// 1/0); --flag alone is on.
type switchValue struct{ p *bool }

var switchWords = map[string]bool{
	"on": true, "true": true, "yes": true, "1": true,
	"off": false, "false": false, "no": false, "0": false,
}

func (v switchValue) String() string {
	if *v.p {
		return "on"
	}
	return "off"
}

func (v switchValue) Set(s string) error {
	b, ok := switchWords[strings.ToLower(s)]
	if !ok {
		return fmt.Errorf("want on or off")
	}
	*v.p = b
	return nil
}

func (switchValue) Type() string { return "on|off" }

func (switchValue) accepts(word string) bool {
	_, ok := switchWords[strings.ToLower(word)]
	return ok
}

// switchVar defines a switchValue flag with default def; --name alone
// sets it on.
func switchVar(f *pflag.FlagSet, p *bool, name string, def bool, usage string) {
	*p = def
	f.Var(switchValue{p}, name, usage)
	f.Lookup(name).NoOptDefVal = "on"
}

// choiceValue is a string flag that accepts the words in choices; the
// first shown of them name it in the help (the rest are aliases).
type choiceValue struct {
	p       *string
	choices []string
	shown   int
}

func (v choiceValue) String() string { return *v.p }

func (v choiceValue) Set(s string) error {
	if !v.accepts(s) {
		return fmt.Errorf("want %s", orList(v.choices))
	}
	*v.p = strings.ToLower(s)
	return nil
}

func (v choiceValue) Type() string { return strings.Join(v.choices[:v.shown], "|") }

func (v choiceValue) accepts(word string) bool {
	for _, c := range v.choices {
		if strings.EqualFold(word, c) {
			return true
		}
	}
	return false
}

// choiceVar defines a choiceValue flag with default def; --name alone
// means noOpt (if not empty). The help names the first shown choices.
func choiceVar(f *pflag.FlagSet, p *string, name, def, noOpt string, choices []string, shown int, usage string) {
	*p = def
	f.Var(choiceValue{p, choices, shown}, name, usage)
	f.Lookup(name).NoOptDefVal = noOpt
}

// orList writes "a, b or c".
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// joinWordValues rewrites "--flag word" (and "-f word") to "--flag=word"
// for the flags of the command args name whose value is a wordValue with
// NoOptDefVal set, when word is one the flag accepts. Everything else,
// and all after "--", is left alone.
func joinWordValues(root *cobra.Command, args []string) []string {
	cmd, _, err := root.Find(args)
	if err != nil || cmd == nil {
		return args
	}
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if a == "--" {
			return append(out, args[i+1:]...)
		}
		var f *pflag.Flag
		switch {
		case strings.HasPrefix(a, "--") && !strings.Contains(a, "="):
			f = cmd.Flags().Lookup(a[2:])
		case len(a) == 2 && a[0] == '-' && a[1] != '-':
			f = cmd.Flags().ShorthandLookup(a[1:])
		}
		if f == nil || f.NoOptDefVal == "" || i+1 >= len(args) {
			continue
		}
		if wv, ok := f.Value.(wordValue); ok && wv.accepts(args[i+1]) {
			out[len(out)-1] = a + "=" + args[i+1]
			i++
		}
	}
	return out
}

// sizeValue is a byte count: a number, optionally with a binary suffix K,
// M, G or T (KiB, MiB, GiB, TiB; a trailing "iB" or "B" is allowed).
type sizeValue struct{ p *uint64 }

func (v sizeValue) String() string { return formatSize(*v.p) }

func (v sizeValue) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*v.p = n
	return nil
}

func (sizeValue) Type() string { return "bytes" }

// sizeVar defines a byte-count flag (sizeValue).
func sizeVar(f *pflag.FlagSet, p *uint64, name string, def uint64, usage string) {
	*p = def
	f.Var(sizeValue{p}, name, usage)
}

var sizeSuffixes = []struct {
	suffix string
	shift  uint
}{{"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}}

// parseSize reads a sizeValue.
func parseSize(s string) (uint64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	shift := uint(0)
	for _, x := range sizeSuffixes {
		if strings.HasSuffix(t, x.suffix) {
			t, shift = strings.TrimSuffix(t, x.suffix), x.shift
			break
		}
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil || n > math.MaxUint64>>shift {
		return 0, fmt.Errorf("size %q: want a number of bytes, optionally with K, M, G or T (binary)", s)
	}
	return n << shift, nil
}

// formatSize writes n as parseSize reads it, with the largest exact suffix.
func formatSize(n uint64) string {
	for _, x := range sizeSuffixes {
		if n != 0 && n%(1<<x.shift) == 0 {
			return strconv.FormatUint(n>>x.shift, 10) + x.suffix
		}
	}
	return strconv.FormatUint(n, 10)
}
