package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// docCommand is one siwtun command line shown in README.md or doc/.
type docCommand struct {
	where string   // file:line
	args  []string // after "siwtun"
}

// shellWords splits a command line as sh does for the plain lines the
// pages show: words separated by blanks, single and double quotes
// grouping, a # starting a comment, and &&, ||, ;, | and & ending a
// command.
func shellWords(line string) [][]string {
	var cmds [][]string
	var words []string
	var w strings.Builder
	inWord, quote := false, rune(0)
	flushWord := func() {
		if inWord {
			words = append(words, w.String())
		}
		w.Reset()
		inWord = false
	}
	flushCmd := func() {
		flushWord()
		if len(words) > 0 {
			cmds = append(cmds, words)
		}
		words = nil
	}
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				w.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == '#' && !inWord:
			flushCmd()
			return cmds
		case r == ' ' || r == '\t':
			flushWord()
		case r == '&' || r == '|' || r == ';':
			flushCmd()
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	flushCmd()
	return cmds
}

// siwtunArgs returns the arguments of a siwtun invocation in words, past
// what runs it (sudo, ip netns exec NAME, VAR=value), or false when the
// command is not siwtun.
func siwtunArgs(words []string) ([]string, bool) {
	for len(words) > 0 {
		switch {
		case words[0] == "sudo":
			words = words[1:]
		case len(words) >= 4 && words[0] == "ip" && words[1] == "netns" && words[2] == "exec":
			words = words[4:]
		case strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-"):
			words = words[1:]
		case words[0] == "siwtun" || strings.HasSuffix(words[0], "/siwtun"):
			return words[1:], true
		default:
			return nil, false
		}
	}
	return nil, false
}

// docCommands collects the siwtun command lines of the ```sh blocks of
// the pages, and the "$ siwtun ..." lines of their other blocks.
func docCommands(t *testing.T, pages []string) []docCommand {
	t.Helper()
	var out []docCommand
	for _, page := range pages {
		f, err := os.Open(page)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		block, n, cont := "", 0, ""
		for sc.Scan() {
			n++
			line := sc.Text()
			trimmed := strings.TrimSpace(line)
			if strings.HasPrefix(trimmed, "```") {
				if block == "" {
					block = strings.TrimPrefix(trimmed, "```") + " "
				} else {
					block = ""
				}
				continue
			}
			if block == "" {
				continue
			}
			if block != "sh " {
				if !strings.HasPrefix(trimmed, "$ ") {
					continue
				}
				trimmed = strings.TrimPrefix(trimmed, "$ ")
			}
			if strings.HasSuffix(trimmed, "\\") {
				cont += strings.TrimSuffix(trimmed, "\\") + " "
				continue
			}
			trimmed, cont = cont+trimmed, ""
			for _, words := range shellWords(trimmed) {
				if args, ok := siwtunArgs(words); ok {
					out = append(out, docCommand{where: page + ":" + strconv.Itoa(n), args: args})
				}
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestDocCommandsParse: every siwtun command line README.md and the doc/
// pages show names a command that exists, with flags it takes and the
// arguments it accepts, as the tool parses them (the word flags joined
// first, as main does). It runs none of them: the pages' commands that need
// root and daemons are run by the integration tests.
func TestDocCommandsParse(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join("..", "..", "doc", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{filepath.Join("..", "..", "README.md")}, pages...)
	cmds := docCommands(t, pages)
	if len(cmds) < 30 {
		t.Fatalf("found only %d siwtun command lines in README.md and doc/", len(cmds))
	}
	t.Logf("%d siwtun command lines in %d pages", len(cmds), len(pages))
	for _, dc := range cmds {
		root := newRootCmd()
		args := joinWordValues(root, dc.args)
		c, rest, err := root.Find(args)
		if err != nil {
			t.Errorf("%s: siwtun %s: %v", dc.where, strings.Join(dc.args, " "), err)
			continue
		}
		if err := c.ParseFlags(rest); err != nil {
			t.Errorf("%s: siwtun %s: %v", dc.where, strings.Join(dc.args, " "), err)
			continue
		}
		if err := c.ValidateArgs(c.Flags().Args()); err != nil {
			t.Errorf("%s: siwtun %s: %v", dc.where, strings.Join(dc.args, " "), err)
		}
	}
}

// TestShellWords: the splitting the page check relies on.
func TestShellWords(t *testing.T) {
	got := shellWords(`ip netns exec blue siwtun up --dev 'a b' & siwtun ctl qp # a comment`)
	want := [][]string{{"ip", "netns", "exec", "blue", "siwtun", "up", "--dev", "a b"}, {"siwtun", "ctl", "qp"}}
	if len(got) != len(want) {
		t.Fatalf("got %q", got)
	}
	for i := range want {
		if strings.Join(got[i], "|") != strings.Join(want[i], "|") {
			t.Errorf("command %d: got %q, want %q", i, got[i], want[i])
		}
	}
	if args, ok := siwtunArgs([]string{"SIWTUN_SOCKET_DIR=/x", "sudo", "./bin/siwtun", "ctl", "link"}); !ok || strings.Join(args, " ") != "ctl link" {
		t.Errorf("siwtunArgs: %q %v", args, ok)
	}
	if _, ok := siwtunArgs([]string{"tshark", "-r", "x"}); ok {
		t.Error("tshark taken for siwtun")
	}
}
