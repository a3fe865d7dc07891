module chunk_decoy

go 1.22
