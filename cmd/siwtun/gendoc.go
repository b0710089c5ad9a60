package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
)

// The man pages (doc/man) and the CLI reference (doc/cli) are generated
// from the commands themselves, so they say what the binary does; the test
// TestGeneratedDocsCurrent fails when a command changes and they do not.
//go:generate go run . gendoc --man ../../doc/man --markdown ../../doc/cli

// manDate is the date the man pages carry. cobra would print the day they
// were generated, which changes the pages on every run; the pages are
// committed and checked, so the date is fixed and moves with releases.
var manDate = time.Date(2026, time.November, 1, 0, 0, 0, 0, time.UTC)

// newGenDocCmd is the hidden command that writes the man pages and the
// CLI reference (go generate runs it; packagers may too).
func newGenDocCmd() *cobra.Command {
	var manDir, mdDir string
	cmd := &cobra.Command{
		Use:    "gendoc --man DIR --markdown DIR",
		Short:  "Write the man pages and the Markdown CLI reference of every command",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if manDir == "" && mdDir == "" {
				return fmt.Errorf("nothing to do: give --man DIR, --markdown DIR or both")
			}
			// The defaults the pages show are the built-in ones, not this
			// environment's.
			os.Unsetenv("SIWTUN_SOCKET_DIR")
			return genDocs(manDir, mdDir)
		},
	}
	cmd.Flags().StringVar(&manDir, "man", "", "directory of the man pages (siwtun.1, siwtun-up.1, ...)")
	cmd.Flags().StringVar(&mdDir, "markdown", "", "directory of the Markdown reference (siwtun.md, siwtun_up.md, ...)")
	return cmd
}

// docRoot returns the command tree the documentation describes: the
// commands of newRootCmd with cobra's completion and help commands, which
// cobra adds only when a command line runs. cobra's generators take the
// help texts for Markdown, where they are plain text: <dev> would be an
// HTML tag and ib_*_bw emphasis, so they are escaped; for the man pages
// also the synopsis and the flags' texts, which the Markdown reference
// prints in code blocks.
func docRoot(man bool) *cobra.Command {
	root := newRootCmd()
	root.DisableAutoGenTag = true // no "generated on <date>" line
	root.InitDefaultCompletionCmd()
	root.InitDefaultHelpCmd()
	seen := map[*pflag.Flag]bool{}
	escapeFlag := func(f *pflag.Flag) {
		if !seen[f] {
			seen[f] = true
			f.Usage = escapeMarkdown(f.Usage)
		}
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Short = escapeMarkdown(c.Short)
		c.Long = escapeMarkdown(c.Long)
		if man {
			name, rest, _ := strings.Cut(c.Use, " ")
			if rest != "" {
				c.Use = name + " " + escapeMarkdown(rest)
			}
			c.Flags().VisitAll(escapeFlag)
			c.PersistentFlags().VisitAll(escapeFlag)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return root
}

// markdownSpecial are the characters Markdown gives a meaning in running
// text, each escaped by a backslash.
var markdownSpecial = strings.NewReplacer(`\`, `\\`, "<", `\<`, ">", `\>`, "*", `\*`, "_", `\_`,
	"[", `\[`, "]", `\]`, "`", "\\`")

// escapeMarkdown returns s with the characters Markdown would interpret
// escaped, so it reads as written.
func escapeMarkdown(s string) string { return markdownSpecial.Replace(s) }

// genDocs writes the man pages into manDir and the Markdown reference into
// mdDir (either may be empty), replacing the pages generated before so a
// removed command's page goes too.
func genDocs(manDir, mdDir string) error {
	if manDir != "" {
		if err := cleanDir(manDir, ".1"); err != nil {
			return err
		}
		date := manDate
		header := &doc.GenManHeader{Section: "1", Date: &date, Source: "siwtun", Manual: "siwtun manual"}
		if err := doc.GenManTree(docRoot(true), header, manDir); err != nil {
			return fmt.Errorf("man pages: %w", err)
		}
	}
	if mdDir != "" {
		if err := cleanDir(mdDir, ".md"); err != nil {
			return err
		}
		if err := doc.GenMarkdownTree(docRoot(false), mdDir); err != nil {
			return fmt.Errorf("markdown reference: %w", err)
		}
	}
	return nil
}

// cleanDir creates dir, or removes the pages (siwtun*<ext>) it holds.
func cleanDir(dir, ext string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, err := filepath.Glob(filepath.Join(dir, "siwtun*"+ext))
	if err != nil {
		return err
	}
	for _, f := range old {
		if strings.HasSuffix(f, ext) {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	return nil
}
