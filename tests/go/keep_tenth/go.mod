module keep_tenth

go 1.22
