package verbs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"regexp"
	"testing"

	"github.com/siwtun/siwtun/verbs"
)

// TestAliasDocsListFields: the structs verbs takes from verbs/ibv are
// aliases, for which go doc prints only "type SendWR = ibv.SendWR" and the
// comment; the comments list the fields, so that go doc verbs.SendWR shows
// them. Every field of each struct must be in its list.
func TestAliasDocsListFields(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "types.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.TYPE {
			continue
		}
		for _, spec := range g.Specs {
			ts := spec.(*ast.TypeSpec)
			doc := ts.Doc
			if doc == nil {
				doc = g.Doc
			}
			if doc != nil {
				docs[ts.Name.Name] = doc.Text()
			}
		}
	}
	for name, v := range map[string]any{
		"SGE": verbs.SGE{}, "SendWR": verbs.SendWR{}, "RecvWR": verbs.RecvWR{},
		"WorkCompletion": verbs.WorkCompletion{}, "ConnParam": verbs.ConnParam{}, "Event": verbs.Event{}, "MWBind": verbs.MWBind{},
	} {
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			field := typ.Field(i).Name
			if !regexp.MustCompile(`(?m)^\t` + field + ` `).MatchString(docs[name]) {
				t.Errorf("the doc comment of verbs.%s does not list the field %s:\n%s", name, field, docs[name])
			}
		}
	}
}
